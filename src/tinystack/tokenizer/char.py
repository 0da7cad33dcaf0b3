"""CharTokenizer: one token per character (nanoGPT's char-level Shakespeare), same interface as BPETokenizer.

Ids: 0..n-1 are the distinct characters of the training text in sorted order, then
the specials `<|endoftext|>` and `<|unk|>` (any character not seen in training
encodes to `<|unk|>`, so every string encodes; it decodes to U+FFFD).

Saved as a Hugging Face `tokenizers` file (a WordLevel model behind a one-character
Split pre-tokenizer), so `tokenizers.Tokenizer.from_file` loads it and gives the same
ids; `tinystack.tokenizer.load_tokenizer` reads its file through `tokenizers`, like any other.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import AbstractSet, Iterable, Literal, Sequence

from tinystack.atomic import atomic_open, write_json

EOT, UNK = "<|endoftext|>", "<|unk|>"
TOKENIZER_FILE = "tokenizer.json"
_SPLIT = {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated", "invert": False}


class CharTokenizer:
    """Build with `train(texts)` or `load(dir)`; `chars` are the non-special tokens in id order."""

    def __init__(self, chars: Sequence[str]) -> None:
        if any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise ValueError("chars must be distinct single characters")
        self.chars = list(chars)
        self._ids = {c: i for i, c in enumerate(self.chars)}
        n = len(self.chars)
        self._special = {EOT: n, UNK: n + 1}

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for t in texts:
            seen.update(t)
        return cls(sorted(seen))

    # --- the BPETokenizer interface the pipeline, eval and inference use --------------------
    @property
    def vocab_size(self) -> int:
        return len(self.chars) + len(self._special)

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def eos_token_id(self) -> int:
        return self._special[EOT]

    def encode_ordinary(self, text: str) -> list[int]:
        unk = self._special[UNK]
        return [self._ids.get(c, unk) for c in text]

    def encode(self, text: str, allowed_special: Literal["all"] | AbstractSet[str] | None = "all") -> list[int]:
        """Like encode_ordinary, but allowed special strings (default: all) become their ids."""
        allowed = set(self._special) if allowed_special == "all" else set(allowed_special or ())
        ids: list[int] = []
        i = 0
        while i < len(text):
            for s in allowed:
                if text.startswith(s, i):
                    ids.append(self._special[s])
                    i += len(s)
                    break
            else:
                ids.extend(self.encode_ordinary(text[i]))
                i += 1
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode_bytes([token_id])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.decode(ids).encode("utf-8")

    def decode(self, ids: Sequence[int]) -> str:
        n, out = len(self.chars), []
        for i in ids:
            if 0 <= i < n:
                out.append(self.chars[i])
            elif i == self._special[EOT]:
                out.append(EOT)
            elif i == self._special[UNK]:
                out.append("\ufffd")
            else:
                raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return "".join(out)

    # --- persistence -----------------------------------------------------------------------------
    def to_json_bytes(self) -> bytes:
        vocab = {c: i for i, c in enumerate(self.chars)} | self._special
        added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for s, i in self._special.items()]
        obj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
               "pre_tokenizer": _SPLIT, "post_processor": None, "decoder": {"type": "Fuse"},
               "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK}}
        return (json.dumps(obj, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_json_bytes()).hexdigest()

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        with atomic_open(path, "wb") as f:
            f.write(self.to_json_bytes())
        write_json(directory / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                          "clean_up_tokenization_spaces": False,
                                                          "eos_token": EOT, "bos_token": EOT, "unk_token": UNK})
        return path

    @classmethod
    def from_json(cls, obj: dict) -> CharTokenizer:
        vocab = obj["model"]["vocab"]
        specials = {t["content"] for t in obj.get("added_tokens", [])}
        return cls([c for c, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if c not in specials])

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        path = Path(path)
        with open(path / TOKENIZER_FILE if path.is_dir() else path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
