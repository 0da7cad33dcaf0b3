"""Offline evaluation of a model directory on the data splits: the content of eval.json.

    model_dir + tok_dir/{val,test}.bin  -> fixed windows -> loss, perplexity, bits/byte, accuracy (scoring.py)
    model_dir + data_dir/{val,test}.jsonl (up to max_docs records each, evenly spaced)
        -> per-document scores (scoring.py) -> total / by_source / by_length (slices.py)
        -> worst cases, source blame, leakage vs data_dir/train.jsonl (attribution.py, neardup.py)
        -> findings: the worst slices in words

Per split the top-level metrics are the window ones (scoring.score_tokens: what training reports as its
final val loss, and what the model's lineage records); the per-document ones live under
"docs". Without a token directory the window metrics are computed from the JSONL
encoded in memory exactly as the token files would be.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tinystack.config import EvalConfig
from tinystack.eval.attribution import findings, leakage, source_blame, worst_cases
from tinystack.eval.neardup import find_near_duplicates
from tinystack.eval.scoring import context_len, document_ids, score_documents, score_tokens
from tinystack.eval.slices import split_report
from tinystack.tokenizer.shards import load_tokens, token_byte_lengths

SPLITS = ("val", "test")


def read_records(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_splits(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The held-out splits' records (a missing file reads as an empty split)."""
    return {s: read_records(data_dir / f"{s}.jsonl") if (data_dir / f"{s}.jsonl").is_file() else [] for s in SPLITS}


def pick_evenly(n: int, k: int) -> np.ndarray:
    """Indices of k items spread evenly over n (all of them when k is 0 or >= n)."""
    if not k or k >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(int))


def _token_stream(tokenizer: Any, records: Sequence[dict[str, Any]]) -> np.ndarray:
    """What encode_jsonl_to_bin would write: each text's tokens then the separator."""
    ids: list[int] = []
    for r in records:
        ids.extend(tokenizer.encode_ordinary(r["text"]))
        ids.append(tokenizer.eos_token_id)
    return np.asarray(ids, dtype=np.int64)


def window_metrics(model: Any, tokenizer: Any, cfg: EvalConfig, *,
                   records: dict[str, list[dict[str, Any]]] | None = None, tok_dir: Path | None = None,
                   device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """Fixed-window metrics per split, from tok_dir/{split}.bin when present, else from the records."""

    nbytes = token_byte_lengths(tokenizer)
    results: dict[str, Any] = {}
    for split in SPLITS:
        if tok_dir is not None and (tok_dir / f"{split}.bin").is_file():
            tokens = load_tokens(tok_dir / f"{split}.bin")
        else:
            tokens = _token_stream(tokenizer, (records or {}).get(split, []))
        if len(tokens) <= context_len(model):
            results[split] = {"skipped": f"only {len(tokens)} tokens"}
            continue
        results[split] = score_tokens(model, tokens, nbytes, max_windows=cfg.max_windows,
                                      batch_size=cfg.windows_per_batch, device=device, progress=progress,
                                      label=f"eval {split} windows").to_dict()
    return results


def evaluate_model(model: Any, tokenizer: Any, cfg: EvalConfig, *, data_dir: Path | None = None,
                   tok_dir: Path | None = None, device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """Everything eval.json holds for the val and test splits (see module docstring)."""
    if data_dir is None and tok_dir is None:
        raise ValueError("need a data directory (JSONL splits) or a token directory (.bin files)")
    records = read_splits(data_dir) if data_dir else {}
    results = window_metrics(model, tokenizer, cfg, records=records, tok_dir=tok_dir, device=device,
                             progress=progress)
    if data_dir is None:
        return results

    picked = {s: [records[s][i] for i in pick_evenly(len(records[s]), cfg.max_docs)] for s in SPLITS}
    train = read_records(data_dir / "train.jsonl") if (data_dir / "train.jsonl").is_file() else []
    queries = [r["text"] for s in SPLITS for r in picked[s]]
    dups = find_near_duplicates([r["text"] for r in train], queries, cfg.near_dup_threshold)
    train_ids = [r.get("id", i) for i, r in enumerate(train)]
    offset = 0
    all_findings: list[str] = []
    for split in SPLITS:
        recs = picked[split]
        split_dups, offset = dups[offset:offset + len(recs)], offset + len(recs)
        if not recs or "skipped" in results[split]:
            continue
        ids = [document_ids(tokenizer, r["text"]) for r in recs]
        scores = score_documents(model, ids, [len(r["text"].encode("utf-8")) + 1 for r in recs],
                                 batch_size=cfg.windows_per_batch, device=device, progress=progress,
                                 label=f"eval {split}")
        rep = split_report(scores, [r.get("source", "unknown") for r in recs], cfg.length_buckets)
        rep["source_blame"] = source_blame(rep["by_source"], rep["total"])
        rep["worst_cases"] = worst_cases(scores, recs, cfg.worst_k, near_dups=split_dups, train_ids=train_ids)
        rep["leakage"] = leakage(split_dups, recs, train_ids)
        rep["per_doc"] = {"loss": [round(float(x), 4) for x in scores.loss], "tokens": scores.tokens.tolist(),
                          "source": [r.get("source", "unknown") for r in recs]}
        rep["findings"] = findings(split, rep)
        all_findings += rep["findings"]
        results[split]["docs"] = rep
    results["findings"] = all_findings
    return results
