"""tokenizer.json: the Hugging Face `tokenizers` file format, written and read by hand.

We save in HF's format so `tokenizers.Tokenizer.from_file(dir / "tokenizer.json")`
(and transformers' PreTrainedTokenizerFast) load *our* tokenizer and produce the
same ids. Nothing here imports `tokenizers`; the tests check compatibility.

The trick: HF's byte-level BPE stores tokens as text, not bytes. GPT-2 maps each
of the 256 byte values to a printable Unicode character (`bytes_to_unicode`), so
a token's bytes become a string with no spaces or control characters. That lets
merges be written as "a b" (space-separated) and the vocab as {string: id}.

The pipeline is declared in the file: Split(our regex, "Isolated") cuts the
pieces, ByteLevel(use_regex=False) only maps bytes to those characters, the BPE
model merges by rank (the order of `merges`), ByteLevel decodes. Specials go in
`added_tokens`, which HF cuts out before pre-tokenization -- as we do.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map byte -> printable character (the 188 printable
    Latin-1 bytes map to themselves, the other 68 to U+0100.. in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _tok_str(bs: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in bs)


def _tok_bytes(s: str) -> bytes:
    table = unicode_to_bytes()
    try:
        return bytes(table[c] for c in s)
    except KeyError as e:
        raise ValueError(f"token {s!r} is not byte-level encoded") from e


def to_hf_json(
    pattern: str,
    vocab: Sequence[bytes],
    merges: Sequence[tuple[int, int]],
    special_tokens: Mapping[str, int],
) -> dict[str, Any]:
    """Build the tokenizer.json object. `vocab[i]` is the bytes of id i (specials excluded)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for s, i in sorted(special_tokens.items(), key=lambda kv: kv[1])
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,  # pure BPE: a piece is always built by merges, never looked up whole
            "vocab": {_tok_str(bs): i for i, bs in enumerate(vocab)},
            # "a b" strings: readable by every tokenizers version (>= 0.20 also accepts [a, b]).
            "merges": [f"{_tok_str(vocab[a])} {_tok_str(vocab[b])}" for a, b in merges],
        },
    }


def from_hf_json(obj: Mapping[str, Any]) -> tuple[str, list[bytes], list[tuple[int, int]], dict[str, int]]:
    """Parse a byte-level BPE tokenizer.json written by `to_hf_json` (or shaped like it).

    Returns (pattern, vocab bytes by id, merges as id pairs in rank order, specials).
    Raises ValueError for anything this tokenizer cannot reproduce exactly.
    """
    model = obj.get("model") or {}
    if model.get("type") != "BPE" or model.get("ignore_merges") or model.get("byte_fallback"):
        raise ValueError("tokenizer.json: expected a plain byte-level BPE model")
    if obj.get("normalizer") is not None:
        raise ValueError("tokenizer.json: normalizers are not supported")
    pre = obj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if (len(steps) != 2 or steps[0].get("type") != "Split" or steps[0].get("behavior") != "Isolated"
            or steps[0].get("invert") or "Regex" not in steps[0].get("pattern", {})
            or steps[1].get("type") != "ByteLevel" or steps[1].get("use_regex")
            or steps[1].get("add_prefix_space")):
        raise ValueError("tokenizer.json: expected pre_tokenizer "
                         "Sequence[Split(Regex, Isolated), ByteLevel(use_regex=False)]")
    pattern = steps[0]["pattern"]["Regex"]

    str_vocab: dict[str, int] = model["vocab"]
    n = len(str_vocab)
    if sorted(str_vocab.values()) != list(range(n)):
        raise ValueError("tokenizer.json: vocab ids must be 0..n-1")
    vocab: list[bytes] = [b""] * n
    for s, i in str_vocab.items():
        vocab[i] = _tok_bytes(s)
    merges: list[tuple[int, int]] = []
    for m in model["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        merges.append((str_vocab[a], str_vocab[b]))
    specials = {t["content"]: int(t["id"]) for t in obj.get("added_tokens", [])}
    return pattern, vocab, merges, specials
