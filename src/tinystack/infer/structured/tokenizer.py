"""Our tokenizer as llguidance sees it: every token's exact bytes, the special tokens, EOS.

llguidance matches grammars over bytes, so it needs each token's bytes, not its text: a byte-level BPE token
(ours, GPT-2's, SmolLM2's) maps back through GPT-2's byte table, a sentencepiece byte-fallback token <0xNN> is
that one byte, "▁" is a space (tokenizer/loader.Tokenizer.token_bytes, the one home of that rule). Special
tokens (EOS, chat markers) are flagged as special, so a constraint never lets one appear inside its text: a
grammar reaches them only by name (<|im_end|>) or as the end of an accepted output (EOS).

Built once per tokenizer object (it walks the whole vocabulary) and kept on it; no `transformers` involved.
"""
from __future__ import annotations

from typing import Any

import llguidance

_ATTR = "_llguidance_tokenizer"
# what the bridge reads of one of our tokenizers (tokenizer/loader.Tokenizer has them all)
NEEDS = ("vocab_size", "token_bytes", "encode_plain", "special_tokens", "eos_token_ids", "eos_token_id")


class UnsupportedTokenizer(ValueError):
    """A tokenizer the bridge cannot read (e.g. the hand-built BPETokenizer object, which has no encode_plain): only
    a tokenizer.json loaded by tokenizer/loader.py can constrain outputs."""


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: tokens (bytes per id), special ids, EOS/BOS, and a call that
    tokenises text without any template (the matcher tokenises forced text with it)."""

    def __init__(self, tokenizer: Any):
        n = tokenizer.vocab_size
        self.tokens = [tokenizer.token_bytes(i) for i in range(n)]
        self.special_token_ids = sorted(set(tokenizer.special_tokens.values()) | set(tokenizer.eos_token_ids))
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = None
        self._encode = tokenizer.encode_plain

    def __call__(self, text: str | bytes) -> list[int]:
        return self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


def llg_tokenizer(tokenizer: Any) -> llguidance.LLTokenizer:
    """The llguidance tokenizer for one of ours (tokenizer/loader.Tokenizer), built on first use and cached on it;
    UnsupportedTokenizer for one without what NEEDS lists.
    Every EOS id the model stops at is an EOS to the matcher: where a constraint is complete, any of them ends
    the output."""
    cached = getattr(tokenizer, _ATTR, None)
    if cached is None:
        missing = [a for a in NEEDS if not hasattr(tokenizer, a)]
        if missing:
            lacks = ", ".join(missing)
            raise UnsupportedTokenizer(f"this model's tokenizer cannot constrain outputs (it has no {lacks}: only "
                                       "a tokenizer.json loaded from a model directory can)")
        vocab = _Vocabulary(tokenizer)
        eos = sorted(tokenizer.eos_token_ids) or None
        cached = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=len(vocab.tokens), eos_token=eos)
        setattr(tokenizer, _ATTR, cached)
    return cached
