"""The package's one loader (`load_tokenizer`): our BPE and char files load through `tokenizers`
with the hand-built tokenizer's ids, bytes, specials and fingerprint, and save the same bytes."""
from __future__ import annotations

from pathlib import Path

import pytest

from tinystack.tokenizer import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer
from tinystack.tokenizer.shards import token_byte_lengths

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak. héllo ✓ 数字 123\n"


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_loaded_tokenizer_is_the_hand_built_one(kind: str, tmp_path: Path) -> None:
    ours = BPETokenizer.train([TEXT * 20], vocab_size=300) if kind == "bpe" else CharTokenizer.train([TEXT])
    ours.save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, Tokenizer)
    for text in (TEXT, "<|endoftext|> is text here", "Speak, speak!", ""):
        assert loaded.encode_ordinary(text) == ours.encode_ordinary(text)
    assert loaded.decode(ours.encode_ordinary(TEXT)) == TEXT
    assert loaded.vocab_size == ours.vocab_size and loaded.eos_token_id == ours.eos_token_id
    assert loaded.special_tokens == ours.special_tokens
    assert loaded.fingerprint() == ours.fingerprint()
    # evaluation's bits per byte count every token's bytes: the same through either tokenizer
    assert (token_byte_lengths(loaded) == token_byte_lengths(ours)).all()
    assert [loaded.token_bytes(i) for i in range(loaded.vocab_size) if i not in ours.special_tokens.values()] == \
        [ours.token_bytes(i) for i in range(ours.vocab_size) if i not in ours.special_tokens.values()]


def test_save_writes_the_loaded_bytes_and_config(tmp_path: Path) -> None:
    BPETokenizer.train([TEXT * 20], vocab_size=280).save(tmp_path / "a")
    load_tokenizer(tmp_path / "a").save(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()


def test_eos_from_config_json_and_clear_error_without_a_file(tmp_path: Path) -> None:
    tok = BPETokenizer.train([TEXT * 20], vocab_size=280, special_tokens=("<|endoftext|>", "<|pad|>"))
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).eos_token_id == tok.special_tokens["<|endoftext|>"]
    (tmp_path / "config.json").write_text(f'{{"eos_token_id": {tok.special_tokens["<|pad|>"]}}}')
    assert load_tokenizer(tmp_path).eos_token_ids == {tok.special_tokens["<|pad|>"]}
    assert load_tokenizer(tmp_path / "tokenizer.json").eos_token_id == tok.special_tokens["<|pad|>"]
    with pytest.raises(FileNotFoundError, match="missing tokenizer.json"):
        load_tokenizer(tmp_path / "nowhere")
