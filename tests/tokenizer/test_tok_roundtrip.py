"""decode(encode(s)) == s for any valid Unicode string, and decode's error handling."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinystack.tokenizer.bpe as bpe_mod
from tinystack.tokenizer import BPETokenizer
from tinystack.tokenizer.train import merge_word

SAMPLES = [
    "",
    "Hello, world! This is a test of the tokenizer.",
    "机器学习是人工智能的一个分支。",
    "Emoji 🤖🚀 family 👨‍👩‍👧 skin 👍🏽 flags 🇫🇷",
    "def f(x):\n\treturn x ** 2  # comment\n\n\n    indented\r\n",
    "   leading and trailing spaces   ",
    "numbers 1234567890 3.14159 -42 1e10",
    "\x00\x01\x7f control \u200b zero-width \ufeff bom \U0010ffff",
    "<|endoftext|> in the middle <|endoftext|><|endoftext|>",
    "a" * 5000,
    " " * 3000 + "x",
]


@pytest.mark.parametrize("s", SAMPLES)
def test_roundtrip_samples(tok: BPETokenizer, s: str) -> None:
    assert tok.decode(tok.encode(s)) == s
    assert tok.decode(tok.encode_ordinary(s)) == s
    assert tok.decode(tok.encode(s, allowed_special=None)) == s


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_roundtrip_any_unicode(tok: BPETokenizer, s: str) -> None:
    ids = tok.encode(s)
    assert tok.decode(ids) == s
    assert tok.decode_bytes(ids) == s.encode("utf-8")


def test_empty(tok: BPETokenizer) -> None:
    assert tok.encode("") == []
    assert tok.decode([]) == ""


def test_english_compresses(tok: BPETokenizer) -> None:
    s = "The king is dead; long live the king, and all his lords."
    assert len(tok.encode(s)) < len(s.encode("utf-8")) / 2


def test_decode_partial_utf8_uses_replacement(tok: BPETokenizer) -> None:
    ids = tok.encode("你")  # 3 UTF-8 bytes
    cut = tok.decode_bytes(ids)[:2]
    assert tok.decode(list(cut)) == "\ufffd"  # ids 0..255 are the bytes themselves


def test_decode_rejects_bad_ids(tok: BPETokenizer) -> None:
    for bad in ([tok.vocab_size], [-1]):
        with pytest.raises(ValueError):
            tok.decode(bad)


def test_long_piece_heap_matches_simple_loop(tok: BPETokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pieces > _LONG_PIECE bytes take the heap path; it must give the same ids.
    pieces = ["a" * 700, " " * 999, "ab" * 400, "的" * 300, "x" + "=" * 500, "Thethethe" * 50]
    heap_ids = [tok._bpe(p.encode()) for p in pieces]
    monkeypatch.setattr(bpe_mod, "_LONG_PIECE", 10**9)
    assert [tok._bpe(p.encode()) for p in pieces] == heap_ids


def replay_merges(tok: BPETokenizer, b: bytes) -> list[int]:
    """Reference encoder for one piece: apply every merge in rank order, as training did."""
    ids = list(b)
    for rank, (a, c) in enumerate(tok.merges):
        ids = merge_word(ids, a, c, 256 + rank)
    return ids


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="ab ethTé的\n", min_size=0, max_size=300))
def test_both_merge_paths_equal_replaying_merges(tok: BPETokenizer, s: str) -> None:
    b = s.encode("utf-8")
    ref = replay_merges(tok, b)
    assert tok._bpe_heap(list(b)) == ref
    if len(b) <= bpe_mod._LONG_PIECE:
        assert tok._bpe(b) == ref
