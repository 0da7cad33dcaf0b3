"""Pre-tokenization: cut text into the pieces BPE works inside.

BPE never merges across a piece boundary, so the split pattern decides what a
token *can* be: "ing" and " the" yes, "e t" or "3." no. We use the GPT-4
(cl100k) pattern. Contract: `pretokenize(s)` returns pieces whose concatenation
is exactly `s` (the pattern's last alternative `\\s` plus the catch-all
alternatives mean every character is matched), so nothing is ever dropped.

Special tokens ("<|endoftext|>") are cut out *before* the pattern runs, so the
regex never sees them and an allowed special always becomes one id.
"""
from __future__ import annotations

from functools import lru_cache
from typing import AbstractSet, Iterator

import regex

# GPT-4 / cl100k split pattern, one deliberate change: cl100k writes the digit
# rule as `\p{N}{1,3}+` (possessive). Oniguruma -- the engine inside Hugging Face
# `tokenizers` -- reads `{1,3}+` as "one or more groups of 1-3 digits", so "2024"
# would stay whole there and split "202"+"4" in tiktoken. The alternative ends
# right after the quantifier, so plain `{1,3}` has identical semantics in the
# `regex` module and tiktoken, and gives the same splits in all three engines.
# Kept possessive on purpose: `\s++$` -- in Oniguruma `$` also matches before any
# newline, and possessiveness stops it backtracking into that match.
PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


@lru_cache(maxsize=8)
def compile_pattern(pattern: str = PATTERN) -> regex.Pattern:
    return regex.compile(pattern)


@lru_cache(maxsize=32)
def _special_regex(specials: frozenset[str]) -> regex.Pattern:
    # Longest first, so a special that is a prefix of another never wins early.
    alts = sorted(specials, key=lambda s: (-len(s), s))
    return regex.compile("|".join(regex.escape(s) for s in alts))


def split_specials(text: str, specials: AbstractSet[str]) -> Iterator[tuple[str, bool]]:
    """Yield (segment, is_special) covering `text` in order; empty segments are skipped."""
    if not specials:
        if text:
            yield text, False
        return
    pos = 0
    for m in _special_regex(frozenset(specials)).finditer(text):
        if m.start() > pos:
            yield text[pos:m.start()], False
        yield m.group(), True
        pos = m.end()
    if pos < len(text):
        yield text[pos:], False


def pretokenize(text: str, pattern: str = PATTERN) -> list[str]:
    """Split ordinary text (no specials) into pieces; "".join(result) == text."""
    return compile_pattern(pattern).findall(text)
