"""Tokenizer layer: text <-> token ids with a hand-built byte-level BPE, or one token per character.

Data flow:

    train split (texts) --BPETokenizer.train--> merges + specials
        pretokenize.py  cut text into pieces with the GPT-4-style regex
        train.py        learn merges from piece counts (incremental pair counts)
    text --encode--> ids:  cut out specials -> regex pieces -> BPE per piece (cached)
    ids --decode--> text:  concatenate token bytes -> UTF-8 (errors="replace")
    save(DIR) -> DIR/tokenizer.json (Hugging Face `tokenizers` format, hf_format.py)
    load(DIR) <- the same file, read without any tokenizer library
    char.py: CharTokenizer, the same interface, ids = sorted characters (char-level benchmarks)
    load_tokenizer(DIR): whichever of the two the file holds
    shards.py: a split encoded once into a memory-mapped uint16/uint32 .bin

Base vocabulary of the BPE is the 256 bytes (id == byte value), so any string
encodes and round-trips. The file's SHA-256 (`fingerprint()`) is recorded as
lineage by the pipeline.
"""
from __future__ import annotations

import json
from pathlib import Path

from tinystack.tokenizer.bpe import EOT, TOKENIZER_FILE, BPETokenizer
from tinystack.tokenizer.char import CharTokenizer
from tinystack.tokenizer.pretokenize import PATTERN


def load_tokenizer(path: str | Path) -> BPETokenizer | CharTokenizer:
    """Load DIR/tokenizer.json (or the file): a CharTokenizer for a WordLevel model, else a BPETokenizer."""
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    with open(file, encoding="utf-8") as f:
        obj = json.load(f)
    if obj.get("model", {}).get("type") == "WordLevel":
        return CharTokenizer.from_json(obj)
    return BPETokenizer.load(file)


__all__ = ["BPETokenizer", "CharTokenizer", "EOT", "PATTERN", "TOKENIZER_FILE", "load_tokenizer"]
