"""The tokenizer stage: train a BPE or char tokenizer on the train split, encode every split to token files.

Called by `tinystack run` and `tinystack tokenizer train`. Beside the token files it writes `lineage.json`
(the data manifest hash and the tokenizer fingerprint), which the training stage copies into the model's
lineage however it is run.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tinystack.atomic import read_json, write_json
from tinystack.config import Config
from tinystack.progress import console

LINEAGE_FILE = "lineage.json"  # beside the token files: which data and tokenizer they came from


def stage_tokenizer(cfg: Config, data_dir: Path, out_dir: Path) -> dict[str, Any]:
    from tinystack.tokenizer import BPETokenizer, CharTokenizer
    from tinystack.tokenizer.shards import (
        encode_jsonl_to_bin,
        read_jsonl_texts,
        split_by_position,
    )

    t = cfg.tokenizer
    if t.kind not in ("bpe", "char"):
        raise ValueError(f"tokenizer.kind must be 'bpe' or 'char', got {t.kind!r}")
    splits = ("train", "val", "test")
    if t.position_split > 0:  # one continuous text (e.g. a single book): every record, in order, re-split by position
        whole = "\n\n".join(x for s in splits for x in read_jsonl_texts(data_dir / f"{s}.jsonl"))
        texts = [whole[: t.max_train_chars]] if t.kind == "bpe" else [whole]
    else:
        texts = read_jsonl_texts(data_dir / "train.jsonl", t.max_train_chars)
    t0 = time.perf_counter()
    tok = CharTokenizer.train(texts) if t.kind == "char" else BPETokenizer.train(texts, vocab_size=t.vocab_size)
    train_s = time.perf_counter() - t0
    tok.save(out_dir)
    info: dict[str, Any] = {"fingerprint": tok.fingerprint(), "vocab_size": tok.vocab_size, "kind": t.kind,
                            "train_chars": sum(map(len, texts)), "train_s": round(train_s, 2)}
    if t.position_split > 0:
        metas = split_by_position(whole, tok, out_dir, t.position_split)
    else:
        metas = {s: encode_jsonl_to_bin(data_dir / f"{s}.jsonl", tok, out_dir / f"{s}.bin") for s in splits}
    for split, meta in metas.items():
        info[f"{split}_tokens"] = meta["tokens"]
        info[f"{split}_bytes_per_token"] = round(meta["bytes"] / max(meta["tokens"], 1), 3)
    split_txt = (f", split by position ({1 - t.position_split:.0%}/{t.position_split:.0%})"
                 if t.position_split > 0 else "")
    console.print(f"tokenizer: {t.kind} vocab {tok.vocab_size:,} trained on {info['train_chars']:,} chars in "
                  f"{train_s:.1f}s; tokens train {info['train_tokens']:,} / val {info['val_tokens']:,} / "
                  f"test {info['test_tokens']:,} ({info['train_bytes_per_token']} bytes/token){split_txt}")
    write_json(out_dir / LINEAGE_FILE,
               {"data_manifest_hash": _manifest_hash(data_dir), "tokenizer_hash": info["fingerprint"]})
    return info


def _manifest_hash(data_dir: Path) -> str | None:
    """The prepared data's lineage hash (data/manifest.json), or None for splits made by hand."""
    path = data_dir / "manifest.json"
    return read_json(path).get("hash") if path.is_file() else None
