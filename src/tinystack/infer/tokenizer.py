"""Loading a model directory's tokenizer: one path, `tokenizer.json` through the `tokenizers` library.

Our BPE writes a Hugging Face-compatible tokenizer.json (tested against `tokenizers`
in tests/tokenizer), so the same loader serves our models and Hugging Face ones
(GPT-2, Llama, Qwen2, ...). The adapter gives the engine the small interface it
uses, the same as `tinystack.tokenizer.BPETokenizer` (which callers may still pass in):
    encode_ordinary(text) -> ids   special-token text in a prompt stays plain text;
                                   the tokenizer's own template (e.g. Llama's BOS) is applied
    encode_with_special_tokens     the same, but special-token text is the special token: for
                                   prompts a chat template wrote (infer.chat.encode_chat)
    decode(ids) -> str, eos_token_id, eos_token_ids, vocab_size
EOS comes from config.json / generation_config.json, else from a well-known token.
"""
from __future__ import annotations

from pathlib import Path

from tinystack.atomic import read_json

TOKENIZER_FILE = "tokenizer.json"
_EOS_NAMES = ("<|endoftext|>", "</s>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>")


class Tokenizer:
    def __init__(self, tok, eos_token_ids: list[int]):
        self._tok = tok
        self._special = None  # the copy that parses special tokens, made on first use
        self._tok.encode_special_tokens = True  # "<|endoftext|>" typed in a prompt is text, not the token
        self.eos_token_ids = frozenset(eos_token_ids)
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None

    def encode_ordinary(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    encode = encode_ordinary

    def encode_with_special_tokens(self, text: str) -> list[int]:
        # a second tokenizer object rather than flipping the flag: encodes run on several threads
        if self._special is None:
            from tokenizers import Tokenizer as HFTokenizer

            self._special = HFTokenizer.from_str(self._tok.to_str())
            self._special.encode_special_tokens = False
        return self._special.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def _as_list(v) -> list[int]:
    return [] if v is None else [int(x) for x in (v if isinstance(v, list) else [v])]


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    model_dir = Path(model_dir)
    path = model_dir / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: missing {TOKENIZER_FILE}")
    tok = HFTokenizer.from_file(str(path))
    eos: list[int] = []
    for name in ("generation_config.json", "config.json"):
        if not eos and (model_dir / name).is_file():
            eos = _as_list(read_json(model_dir / name).get("eos_token_id"))
    if not eos:
        eos = [i for i in (tok.token_to_id(n) for n in _EOS_NAMES) if i is not None][:1]
    return Tokenizer(tok, eos)
