"""Tokenizer layer: text <-> token ids with a hand-built byte-level BPE, or one token per character.

Data flow:

    train split (texts) --BPETokenizer.train--> merges + specials
        pretokenize.py  cut text into pieces with the GPT-4-style regex
        train.py        learn merges from piece counts (incremental pair counts)
    text --encode--> ids:  cut out specials -> regex pieces -> BPE per piece (cached)
    ids --decode--> text:  concatenate token bytes -> UTF-8 (errors="replace")
    save(DIR) -> DIR/tokenizer.json (Hugging Face `tokenizers` format, hf_format.py)
    BPETokenizer.load(DIR) <- the same file, read without any tokenizer library
    char.py: CharTokenizer, the same interface, ids = sorted characters (char-level benchmarks)
    load_tokenizer(DIR) (loader.py): the package's one loader -- any tokenizer.json (ours, BPE or
        char, or a Hugging Face model's) through `tokenizers`; training, evaluation and inference
        all load through it
    shards.py: a split encoded once into a memory-mapped uint16/uint32 .bin

Base vocabulary of the BPE is the 256 bytes (id == byte value), so any string
encodes and round-trips. The file's SHA-256 (`fingerprint()`) is recorded as
lineage by the pipeline.
"""
from tinystack.tokenizer.bpe import EOT, TOKENIZER_FILE, BPETokenizer
from tinystack.tokenizer.char import CharTokenizer
from tinystack.tokenizer.loader import Tokenizer, load_tokenizer
from tinystack.tokenizer.pretokenize import PATTERN

__all__ = ["EOT", "PATTERN", "TOKENIZER_FILE", "BPETokenizer", "CharTokenizer", "Tokenizer", "load_tokenizer"]
