"""save/load: HF-format tokenizer.json, identical encodings, stable fingerprint."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tinystack.tokenizer import TOKENIZER_FILE, BPETokenizer


def test_save_load_identical(tok: BPETokenizer, mixed: str, tmp_path: Path) -> None:
    path = tok.save(tmp_path)
    assert path == tmp_path / TOKENIZER_FILE
    for loaded in (BPETokenizer.load(tmp_path), BPETokenizer.load(path)):  # dir or file
        assert loaded.merges == tok.merges
        assert loaded.special_tokens == tok.special_tokens and loaded.pattern == tok.pattern
        assert loaded.vocab_size == tok.vocab_size and loaded.eos_token_id == tok.eos_token_id
        s = mixed + "<|endoftext|>" + mixed
        assert loaded.encode(s) == tok.encode(s)
        assert loaded.fingerprint() == tok.fingerprint()


def test_fingerprint_is_sha256_of_file(tok: BPETokenizer, tmp_path: Path) -> None:
    path = tok.save(tmp_path)
    assert tok.fingerprint() == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(tok.fingerprint()) == 64
    tok.save(tmp_path)  # re-saving is byte-identical
    assert tok.fingerprint() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_fingerprint_changes_with_content(tok: BPETokenizer, texts: list[str]) -> None:
    assert BPETokenizer.train(texts, 1000).fingerprint() != tok.fingerprint()


def test_save_is_atomic_and_clean(tok: BPETokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path / "nested" / "dir")  # creates parents
    names = sorted(p.name for p in (tmp_path / "nested" / "dir").iterdir())
    assert names == ["tokenizer.json", "tokenizer_config.json"]  # no temp files left behind


def test_file_is_hf_byte_level_bpe(tok: BPETokenizer, tmp_path: Path) -> None:
    obj = json.loads(tok.save(tmp_path).read_text(encoding="utf-8"))
    assert obj["model"]["type"] == "BPE"
    assert obj["model"]["vocab"]["Ġ"] == 32  # GPT-2 byte->unicode: space is "Ġ"
    assert len(obj["model"]["merges"]) == len(tok.merges)
    assert [t["content"] for t in obj["added_tokens"]] == ["<|endoftext|>"]
    assert obj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == tok.pattern


def test_load_accepts_pair_list_merges(tok: BPETokenizer, tmp_path: Path) -> None:
    # tokenizers >= 0.20 may save merges as [a, b] lists instead of "a b".
    path = tok.save(tmp_path)
    obj = json.loads(path.read_text(encoding="utf-8"))
    obj["model"]["merges"] = [m.split(" ") for m in obj["model"]["merges"]]
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    assert BPETokenizer.load(tmp_path).merges == tok.merges


@pytest.mark.parametrize("breakage", ["normalizer", "model_type", "pre_tokenizer"])
def test_load_rejects_what_it_cannot_reproduce(tok: BPETokenizer, tmp_path: Path, breakage: str) -> None:
    path = tok.save(tmp_path)
    obj = json.loads(path.read_text(encoding="utf-8"))
    if breakage == "normalizer":
        obj["normalizer"] = {"type": "NFC"}
    elif breakage == "model_type":
        obj["model"]["type"] = "WordPiece"
    else:
        obj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}
    path.write_text(json.dumps(obj), encoding="utf-8")
    with pytest.raises(ValueError):
        BPETokenizer.load(tmp_path)
