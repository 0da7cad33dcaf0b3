"""Token files: a JSONL split encoded once into a flat array of token ids on disk.

Every record's text is encoded and followed by the end-of-text token, so the
model learns where documents end; the whole split becomes one `uint16` (or
`uint32` for vocabularies past 65,535) `.bin` file that training and evaluation
memory-map instead of re-tokenizing. A sidecar `<name>.json` records the dtype,
counts and the tokenizer fingerprint, so a stale file is detectable.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tinystack.atomic import atomic_open, read_json, write_json


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def encode_jsonl_to_bin(jsonl: str | Path, tokenizer: Any, out: str | Path,
                        progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Encode every record's "text" of `jsonl` into `out` (.bin) + `out`.json; return the metadata."""
    out = Path(out)
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_token_id
    n_docs = n_tokens = n_bytes = 0
    with open(jsonl, encoding="utf-8") as src, atomic_open(out, "wb") as dst:
        for line in src:
            text = json.loads(line)["text"]
            ids = tokenizer.encode_ordinary(text)
            ids.append(eos)
            dst.write(np.asarray(ids, dtype=dtype).tobytes())
            n_docs += 1
            n_tokens += len(ids)
            n_bytes += len(text.encode("utf-8")) + 1  # +1: the separator stands for one byte
            if progress is not None:
                progress(1)
    meta = {"dtype": dtype.name, "docs": n_docs, "tokens": n_tokens, "bytes": n_bytes,
            "tokenizer": tokenizer.fingerprint(), "source": str(jsonl)}
    write_json(out.with_suffix(".json"), meta)
    return meta


def load_tokens(path: str | Path) -> np.memmap:
    """Memory-map a token file written by `encode_jsonl_to_bin` (read-only)."""
    path = Path(path)
    meta = read_json(path.with_suffix(".json"))
    if meta["tokens"] == 0:  # an empty split (e.g. a corpus with too few sources): mmap refuses empty files
        return np.zeros(0, dtype=np.dtype(meta["dtype"]))
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """UTF-8 byte length of every token id (special tokens count as 1, like the separator)."""
    lengths = np.ones(tokenizer.vocab_size, dtype=np.int64)
    specials = set(tokenizer.special_tokens.values())
    for i in range(tokenizer.vocab_size):
        if i not in specials:
            lengths[i] = len(tokenizer.token_bytes(i))
    return lengths


def read_jsonl_texts(jsonl: str | Path, max_chars: int = 0) -> list[str]:
    """The "text" of every record in file order; with max_chars > 0, stop once that many characters are read."""
    texts, total = [], 0
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            total += len(texts[-1])
            if max_chars and total >= max_chars:
                break
    return texts


def write_token_file(ids: np.ndarray, tokenizer: Any, out: str | Path, *, n_bytes: int, docs: int,
                     source: str) -> dict[str, Any]:
    """Write already-encoded ids as a token file (+ its .json sidecar), like `encode_jsonl_to_bin` does."""
    out = Path(out)
    dtype = token_dtype(tokenizer.vocab_size)
    with atomic_open(out, "wb") as dst:
        dst.write(np.asarray(ids, dtype=dtype).tobytes())
    meta = {"dtype": dtype.name, "docs": docs, "tokens": int(len(ids)), "bytes": n_bytes,
            "tokenizer": tokenizer.fingerprint(), "source": source}
    write_json(out.with_suffix(".json"), meta)
    return meta


def split_by_position(text: str, tokenizer: Any, out_dir: str | Path, val_fraction: float) -> dict[str, dict[str, Any]]:
    """Encode one continuous text and cut it by position: the first 1 - val_fraction of the tokens -> train.bin,
    the rest -> val.bin; test.bin is written empty (a position split has no third part). nanoGPT's split."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    out_dir = Path(out_dir)
    ids = np.asarray(tokenizer.encode_ordinary(text), dtype=np.int64)
    cut = int(len(ids) * (1.0 - val_fraction))
    nbytes = np.asarray([len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)], dtype=np.int64)
    parts = {"train": ids[:cut], "val": ids[cut:], "test": ids[:0]}
    return {name: write_token_file(part, tokenizer, out_dir / f"{name}.bin", n_bytes=int(nbytes[part].sum()),
                                   docs=1 if len(part) else 0, source=f"position split {name} of {len(ids)} tokens")
            for name, part in parts.items()}
