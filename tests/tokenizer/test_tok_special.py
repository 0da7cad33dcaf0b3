"""Special tokens: one id only when allowed; id layout; vocab accessors."""
from __future__ import annotations

import pytest

from tinystack.tokenizer import EOT, BPETokenizer

S = f"first doc{EOT}second doc"


def test_allowed_special_is_one_id(tok: BPETokenizer) -> None:
    ids = tok.encode(S)
    assert ids.count(tok.eos_token_id) == 1
    assert ids == tok.encode(S, allowed_special={EOT})
    assert ids == tok.encode_ordinary("first doc") + [tok.eos_token_id] + tok.encode_ordinary("second doc")


@pytest.mark.parametrize("allowed", [None, set(), frozenset()])
def test_disallowed_special_is_plain_text(tok: BPETokenizer, allowed: object) -> None:
    ids = tok.encode(S, allowed_special=allowed)  # type: ignore[arg-type]
    assert tok.eos_token_id not in ids
    assert ids == tok.encode_ordinary(S)
    assert len(ids) > 3 and tok.decode(ids) == S


def test_unknown_allowed_special_raises(tok: BPETokenizer) -> None:
    with pytest.raises(ValueError):
        tok.encode("x", allowed_special={"<|nope|>"})


def test_id_layout(tok: BPETokenizer) -> None:
    assert tok.vocab_size == 1024
    assert tok.special_tokens == {EOT: 1023} and tok.eos_token_id == 1023
    assert all(tok.token_bytes(i) == bytes([i]) for i in range(256))
    for rank, (a, b) in enumerate(tok.merges):  # merge r makes id 256 + r
        assert tok.token_bytes(256 + rank) == tok.token_bytes(a) + tok.token_bytes(b)
    assert tok.token_bytes(tok.eos_token_id) == EOT.encode()
    assert tok.decode([tok.eos_token_id]) == EOT


def test_several_specials(texts: list[str]) -> None:
    specials = ("<|endoftext|>", "<|user|>", "<|user|>x")  # one is a prefix of another
    t = BPETokenizer.train(texts + ["hello <|user|> world"] * 20, 300, special_tokens=specials)
    assert t.vocab_size == 300 and sorted(t.special_tokens.values()) == [297, 298, 299]
    ids = t.encode("a<|user|>xb<|user|>c")
    assert t.special_tokens["<|user|>x"] in ids and t.special_tokens["<|user|>"] in ids
    assert t.decode(ids) == "a<|user|>xb<|user|>c"
    # Specials in training text are cut out, never learned from.
    assert all(b"<|" not in t.token_bytes(i) for i in range(256, 297))


def test_no_eot_raises() -> None:
    t = BPETokenizer.train(["abc abc"], 260, special_tokens=())
    with pytest.raises(ValueError):
        _ = t.eos_token_id
