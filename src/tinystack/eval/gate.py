"""The regression gate on model directories: run a case file on NEW (and BASELINE), compare.

`run_regression` is what `tinystack eval regress` and the pipeline's regression stage
call; its `summary.regressed` decides the exit status of the command.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tinystack.atomic import read_json
from tinystack.config import EvalConfig, InferConfig
from tinystack.eval.case_sets import build_cases
from tinystack.eval.offline import read_splits, window_metrics
from tinystack.eval.regression import Case, compare, compare_metrics, run_cases
from tinystack.infer.chat import chat_formatter
from tinystack.infer.loading import load_for_inference
from tinystack.tokenizer import load_tokenizer


def load_model_dir(model_dir: Path, device: str = "cpu") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of a model directory, loaded as inference loads them, so evaluation
    tokenizes exactly as inference does. In float32, not weight_format="auto": the gate scores the trained weights
    themselves, the same on every machine (auto's format is a per-machine speed choice)."""

    return load_for_inference(model_dir, InferConfig(weight_format="float32"), device)


def build_heldout_cases(model_dir: Path, data_dir: Path, n_cases: int) -> list[Case]:
    """Cases from the val and test splits; the bar is ln(vocab), the loss of a uniform guess."""

    tok = load_tokenizer(model_dir)
    hf = read_json(model_dir / "config.json")  # GPT-2 calls the context n_positions, Llama max_position_embeddings
    context = hf.get("n_positions") or hf.get("max_position_embeddings") or 128
    records = [r for split in read_splits(data_dir).values() for r in split]
    return build_cases(records, n_cases, math.log(tok.vocab_size), tokenizer=tok, max_target_tokens=context // 2)


def run_regression(model_dir: Path, cases: Sequence[Case], baseline_dir: Path | None = None, *,
                   tolerance: float = EvalConfig.regression_tolerance, device: str = "cpu",
                   data_dir: Path | None = None, metric_tolerance: float = 0.01,
                   eval_cfg: EvalConfig | None = None) -> dict[str, Any]:
    """{"model", "new": per-case results, "baseline"?, "rows"?, "summary"}.

    With a baseline, `rows` compares every case, plus (with `data_dir`) the val/test bits
    per byte on fixed windows, gated at `metric_tolerance`. Without one the summary only
    counts passes, and `regressed` is True when any case fails its own threshold.
    """
    model, tok = load_model_dir(model_dir, device)
    new = run_cases(model, tok, cases, device, _formatter(model_dir, tok, cases))
    out: dict[str, Any] = {"model": str(model_dir), "new": new}
    if baseline_dir is None:
        out["summary"] = {"new_passed": new["passed"], "total": new["total"], "new_mean_loss": new["mean_loss"],
                          "regressed": new["passed"] < new["total"], "baseline": None}
        return out
    base_model, base_tok = load_model_dir(baseline_dir, device)
    base = run_cases(base_model, base_tok, cases, device, _formatter(baseline_dir, base_tok, cases))
    cmp = compare(new, base, cases, tolerance)
    rows, summary = cmp["rows"], {**cmp["summary"], "baseline": str(baseline_dir)}
    if data_dir is not None:
        cfg, records = eval_cfg or EvalConfig(), read_splits(data_dir)
        metrics = [window_metrics(m, t, cfg, records=records, device=device, progress=False)
                   for m, t in ((model, tok), (base_model, base_tok))]
        metric_rows = compare_metrics(*metrics, tolerance=metric_tolerance)
        rows = rows + metric_rows
        for verdict in ("better", "worse", "same"):
            summary[verdict] += sum(r["verdict"] == verdict for r in metric_rows)
        summary["metrics_worse"] = sum(r["verdict"] == "worse" for r in metric_rows)
        summary["regressed"] = summary["regressed"] or summary["metrics_worse"] > 0
    out.update(baseline=base, rows=rows, summary=summary)
    return out


def _formatter(model_dir: Path, tokenizer: Any, cases: Sequence[Case]) -> Any:
    """The model directory's chat formatter when a case is a chat case (each model renders with its own)."""
    if not any(c.chat for c in cases):
        return None

    return chat_formatter(model_dir, tokenizer)
