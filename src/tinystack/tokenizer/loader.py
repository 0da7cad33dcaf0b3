"""Loading a tokenizer.json: the package's one tokenizer loader, through the `tokenizers` library.

Our BPE and char tokenizers write Hugging Face-compatible tokenizer.json files (checked
against `tokenizers` in tests/tokenizer), so one loader serves our tokenizer directories,
our model directories and Hugging Face models (GPT-2, Llama, Qwen2, ...). Training,
evaluation and inference all load through `load_tokenizer`, so evaluation tokenizes
exactly as inference does. The loaded `Tokenizer` offers:

    encode_ordinary(text) -> ids   special-token text in the text stays plain text; the
                                   tokenizer's own template (e.g. Llama's BOS) is applied
    encode_plain(text) -> ids      the same without the template: a piece of an output
    decode(ids) -> str             special tokens left out
    eos_token_id, eos_token_ids, vocab_size, special_tokens {text: id}
    token_bytes(id) -> bytes       the text a token stands for (evaluation's bits per byte)
    fingerprint()                  SHA-256 of the tokenizer.json bytes (the pipeline's lineage)
    save(dir)                      the same bytes (and tokenizer_config.json, when there is one)

EOS comes from config.json / generation_config.json, else from a well-known token.
The hand-built BPETokenizer / CharTokenizer (bpe.py, char.py) train and write the file;
`BPETokenizer.load` reads it back without any library, for the tests that check the two agree.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from tinystack.atomic import atomic_open, read_json
from tinystack.tokenizer.bpe import TOKENIZER_FILE
from tinystack.tokenizer.hf_format import unicode_to_bytes

CONFIG_FILE = "tokenizer_config.json"  # lets transformers' AutoTokenizer load a directory; copied by save
_EOS_NAMES = ("<|endoftext|>", "</s>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>")
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece's byte fallback


def _kinds(part: dict | None) -> set[str]:
    """The component types of a pre_tokenizer / decoder entry (a Sequence counts its members)."""
    if not part:
        return set()
    members = part.get("pretokenizers") or part.get("decoders") or []
    return {part.get("type", "")} | {m.get("type", "") for m in members}


class Tokenizer:
    def __init__(self, tok: Any, raw: bytes, eos_token_ids: list[int], config: bytes | None = None):
        """`tok`: a tokenizers.Tokenizer built from `raw` (the tokenizer.json bytes)."""
        self._tok, self._raw, self._config = tok, raw, config
        self._special: Any = None  # the copy that parses special tokens, made on first use
        self._tok.encode_special_tokens = True  # "<|endoftext|>" typed in a prompt is text, not the token
        self.eos_token_ids = frozenset(eos_token_ids)
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        obj = json.loads(raw)
        kinds = _kinds(obj.get("pre_tokenizer")) | _kinds(obj.get("decoder"))
        self._byte_level = "ByteLevel" in kinds
        decoders = (obj.get("decoder") or {}).get("decoders", [])
        self._metaspace = "Metaspace" in kinds or any(d.get("type") == "Replace" and d.get("content") == " "
                                                      for d in decoders)
        self._added = {int(t["id"]): t["content"] for t in obj.get("added_tokens", [])}
        self.special_tokens = {t["content"]: int(t["id"]) for t in obj.get("added_tokens", []) if t.get("special")}

    def encode_ordinary(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def encode_plain(self, text: str) -> list[int]:
        """The ids of `text` alone: no template (no BOS), special-token text kept as text. For pieces of an output,
        e.g. the text a grammar forces (infer/structured)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_special_tokens(self, text: str) -> list[int]:
        """Like encode_ordinary, but special-token text is the special token: for prompts a chat template wrote
        (infer.chat.encode_chat). A second tokenizer object rather than flipping the flag: encodes run on
        several threads."""
        if self._special is None:
            # deferred: the Rust tokenizer only for a tokenizer.json our BPE does not cover
            from tokenizers import Tokenizer as HFTokenizer

            self._special = HFTokenizer.from_str(self._tok.to_str())
            self._special.encode_special_tokens = False
        return self._special.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for: byte-level tokens map back through GPT-2's table,
        sentencepiece's <0xNN> is that byte and its "▁" a space; anything else is its text."""
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}")
        if self._byte_level:
            table = unicode_to_bytes()
            return bytes(table[c] for c in piece)
        if m := _BYTE_TOKEN.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        return (piece.replace("\u2581", " ") if self._metaspace else piece).encode("utf-8")

    def fingerprint(self) -> str:
        """SHA-256 hex of the tokenizer.json bytes (== BPETokenizer.fingerprint() of the tokenizer that wrote them)."""
        return hashlib.sha256(self._raw).hexdigest()

    def save(self, directory: str | Path) -> Path:
        """Write DIR/tokenizer.json (the bytes loaded, unchanged) and tokenizer_config.json if there was one."""
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        for name, data in ((TOKENIZER_FILE, self._raw), (CONFIG_FILE, self._config)):
            if data is not None:
                with atomic_open(directory / name, "wb") as f:
                    f.write(data)
        return path

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos={sorted(self.eos_token_ids)})"


def _as_list(v: Any) -> list[int]:
    return [] if v is None else [int(x) for x in (v if isinstance(v, list) else [v])]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a model or tokenizer directory (DIR/tokenizer.json), or of the file itself.

    Raises FileNotFoundError when there is no tokenizer.json."""
    # deferred: the Rust tokenizer only for a tokenizer.json our BPE does not cover
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    directory, file = (path, path / TOKENIZER_FILE) if path.is_dir() or not path.suffix else (path.parent, path)
    if not file.is_file():
        raise FileNotFoundError(f"{directory}: missing {TOKENIZER_FILE}")
    raw = file.read_bytes()
    tok = HFTokenizer.from_str(raw.decode("utf-8"))
    eos: list[int] = []
    for name in ("generation_config.json", "config.json"):
        if not eos and (directory / name).is_file():
            eos = _as_list(read_json(directory / name).get("eos_token_id"))
    if not eos:
        eos = [i for i in (tok.token_to_id(n) for n in _EOS_NAMES) if i is not None][:1]
    config = directory / CONFIG_FILE
    return Tokenizer(tok, raw, eos, config.read_bytes() if config.is_file() else None)
