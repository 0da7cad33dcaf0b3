"""Tokenizer layer: text <-> token ids with a hand-built byte-level BPE.

Data flow:

    train split (texts) --BPETokenizer.train--> merges + specials
        pretokenize.py  cut text into pieces with the GPT-4-style regex
        train.py        learn merges from piece counts (incremental pair counts)
    text --encode--> ids:  cut out specials -> regex pieces -> BPE per piece (cached)
    ids --decode--> text:  concatenate token bytes -> UTF-8 (errors="replace")
    save(DIR) -> DIR/tokenizer.json (Hugging Face `tokenizers` format, hf_format.py)
    load(DIR) <- the same file, read without any tokenizer library

Base vocabulary is the 256 bytes (id == byte value), so any string encodes and
round-trips. The file's SHA-256 (`fingerprint()`) is recorded as lineage by the
pipeline.
"""
from tinystack.tokenizer.bpe import EOT, TOKENIZER_FILE, BPETokenizer
from tinystack.tokenizer.pretokenize import PATTERN

__all__ = ["BPETokenizer", "EOT", "PATTERN", "TOKENIZER_FILE"]
