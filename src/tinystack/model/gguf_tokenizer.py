"""A GGUF file's tokenizer metadata -> a `tokenizers` tokenizer.json (+ tokenizer_config.json fields).

GGUF carries no tokenizer.json; llama.cpp stores the tokenizer as metadata:

    tokenizer.ggml.model         "gpt2" = byte-level BPE (the only kind rebuilt here; "llama" =
                                 SentencePiece is refused with that name)
    tokenizer.ggml.pre           which pre-tokenizer split the merges were learned on (below)
    tokenizer.ggml.tokens        the vocabulary, id = position, spelled in GPT-2's byte alphabet
                                 (each byte a printable character: space -> "Ġ", newline -> "Ċ")
    tokenizer.ggml.merges        "left right" pairs, highest priority first
    tokenizer.ggml.token_type    1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
    tokenizer.ggml.{bos,eos,eot,unknown,padding}_token_id, add_bos_token, add_eos_token
    tokenizer.chat_template      the Jinja chat template

The rebuild: a BPE model over the vocabulary and merges; the pre-tokenizer of `pre` (a regex
split, then the byte-to-alphabet mapping); control tokens as special added tokens (matched
whole, dropped when decoding with skip_special_tokens) and user-defined ones as plain added
tokens (matched whole, kept); BOS/EOS added by a template post-processor when the file says
so; the byte-level decoder. Pre-tokenizer splits are llama.cpp's (llama-vocab.cpp): e.g.
"smollm" first isolates every digit, then applies GPT-2's split — the same as SmolLM2's own
tokenizer.json (Digits(individual_digits) + ByteLevel). An unknown `pre` is refused, not guessed.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinystack.model.io import ModelFormatError

CONTROL, USER_DEFINED = 3, 4
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre type -> (regex splits applied in order, ignore_merges: a word already in the vocabulary is one token)
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": ((_GPT2,), False), "gpt2": ((_GPT2,), False),
    "smollm": ((r"\p{N}", _GPT2), False), "starcoder": ((r"\p{N}", _GPT2), False),
    "refact": ((r"\p{N}", _GPT2), False), "codeshell": ((r"\p{N}", _GPT2), False),
    "llama-bpe": ((_LLAMA3,), True), "llama3": ((_LLAMA3,), True), "smaug-bpe": ((_LLAMA3,), True),
    "qwen2": ((_QWEN2,), False), "deepseek-r1-qwen": ((_QWEN2,), False),
}


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (printable Latin-1 bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def build_tokenizer(meta: Callable[[str, Any], Any]) -> tuple[Any, dict[str, Any]]:
    """`meta(key, default)` reads GGUF metadata -> (tokenizers.Tokenizer, tokenizer_config.json dict)."""
    # deferred: the Rust tokenizer only for a GGUF's vocabulary
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta("tokenizer.ggml.model", None)
    if kind != "gpt2":
        raise ModelFormatError(f"unsupported GGUF tokenizer model {kind!r} (only byte-level BPE, 'gpt2')")
    pre = meta("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ModelFormatError(f"unsupported GGUF pre-tokenizer {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})")
    splits, ignore_merges = PRE_TOKENIZERS[pre]
    tokens: list[str] = meta("tokenizer.ggml.tokens", None)
    merges: list[str] = meta("tokenizer.ggml.merges", None)
    if not tokens or merges is None:
        raise ModelFormatError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    types: list[int] = meta("tokenizer.ggml.token_type", None) or [1] * len(tokens)

    # A token spelled outside the byte alphabet (a raw "<|x|>" is fine: ASCII maps to itself) could
    # never come out of byte-level BPE; respell it from its UTF-8 bytes so it can.
    alphabet = _byte_alphabet()
    chars = set(alphabet.values())
    spelled = [t if set(t) <= chars else "".join(alphabet[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception (e.g. a merge of unknown tokens)
        raise ModelFormatError(f"GGUF tokenizer: the vocabulary and merges do not form a BPE model ({e})") from None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # a control token whose spelling needed respelling is a mislabelled normal token: not special
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, s, k in zip(tokens, spelled, types) if k == CONTROL and t == s])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, s, k in zip(tokens, spelled, types) if k == USER_DEFINED and t == s])

    def special(key: str) -> str | None:
        i = meta(f"tokenizer.ggml.{key}_token_id", None)
        return spelled[i] if i is not None and 0 <= i < len(spelled) else None

    bos, eos = special("bos"), special("eos")
    add_bos = bool(meta("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta("tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise ModelFormatError("GGUF tokenizer asks to add BOS/EOS but names no such token")
    if add_bos or add_eos:
        first, last = ([f"{bos}:0"] if add_bos else []), ([f"{eos}:0"] if add_eos else [])
        ids = {t: vocab[t] for t in (bos if add_bos else None, eos if add_eos else None) if t is not None}
        tok.post_processor = processors.TemplateProcessing(
            single=[*first, "$A:0", *last], pair=[*first, "$A:0", *last, *first, "$B:1", *last],
            special_tokens=list(ids.items()))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "unk_token": special("unknown"), "pad_token": special("padding"), "add_bos_token": add_bos,
              "add_eos_token": add_eos, "clean_up_tokenization_spaces": False,
              "chat_template": meta("tokenizer.chat_template", None)}
    return tok, {k: v for k, v in config.items() if v is not None}
