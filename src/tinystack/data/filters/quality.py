"""Quality filters: each a small `Step` that drops a record for one stated reason.

Defaults are chosen to be safe for both English and Chinese text (and for
documentation with code samples, like the built-in corpus): they remove garbage,
not style. Thresholds follow the Gopher rules (Rae et al. 2021) where those apply.

* `WordCountFilter`   too_few_words / too_many_words. A "word" is a run of letters or
                      digits, and every CJK character counts as one word (Chinese
                      and Japanese have no spaces; one character ~ one morpheme).
* `CharsetFilter`     control_chars (C0/C1 controls other than tab/newline), mojibake
                      (U+FFFD, or UTF-8 read as Latin-1: "Ã©", "â€™"...), wrong_script
                      (share of letters in the expected scripts < min_script_ratio).
* `SymbolFilter`      symbol_ratio (symbols such as #, {, =, | over all non-space
                      characters) and digit_ratio.
* `RepetitionFilter`  dup_line_fraction (share of lines that repeat an earlier line),
                      dup_line_chars (share of characters in such lines), and
                      top_ngram (the most frequent word 2/3/4-gram covers more than
                      20/18/16 % of the characters of all words), as in Gopher.

Each step records a few dropped examples in ``stats.examples`` (manifest).
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from tinystack.data.filters.clean import normalize_text
from tinystack.data.filters.ngram_lm import PerplexityFilter
from tinystack.data.io.readers import read_inputs
from tinystack.data.io.records import Record
from tinystack.data.io.rejects import Rejects
from tinystack.data.steps import Step

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
WORD_RE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
SCRIPTS = {
    "latin": re.compile(r"[A-Za-z\u00c0-\u024f]"),
    "cjk": re.compile(rf"[{_CJK}]"),
    "cyrillic": re.compile(r"[\u0400-\u04ff]"),
    "greek": re.compile(r"[\u0370-\u03ff]"),
}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MOJIBAKE = re.compile(r"\ufffd|Ã[\u0080-\u00bf]|â€[\u0080-\u00bf™œ\u009d]|Â[\u00a0-\u00bf]")
_LETTER = re.compile(r"[^\W\d_]")
_DIGIT = re.compile(r"\d")
_SPACE_OR_WORD = re.compile(r"[\s\w]")
_PUNCT = set(".,;:!?'\"()[]-–—…，。、；：！？「」『』（）《》“”‘’")
_ASCII_DIGITS = b"0123456789"
_ASCII_NOT_SYMBOL = bytes(c for c in range(128) if chr(c).isalnum() or chr(c).isspace() or chr(c) in _PUNCT
                          or chr(c) == "_")  # "_" is a word character in `_SPACE_OR_WORD` too


def words(text: str) -> list[str]:
    """Word tokens: letter/digit runs, and each CJK character on its own."""
    return WORD_RE.findall(text)


class WordCountFilter(Step):
    name = "word_count"

    def __init__(self, min_words: int = 3, max_words: int = 0) -> None:
        super().__init__()
        self.min_words, self.max_words = min_words, max_words
        self.stats.extra.update(min_words=min_words, max_words=max_words)

    def process(self, record: Record) -> Record | str:
        n = len(words(record.text))
        if n < self.min_words:
            return "too_few_words"
        if self.max_words > 0 and n > self.max_words:
            return "too_many_words"
        return record


class CharsetFilter(Step):
    """Drop control characters, mojibake, and text mostly outside the expected scripts."""

    name = "charset"

    def __init__(self, scripts: tuple[str, ...] = ("latin", "cjk"), min_script_ratio: float = 0.5,
                 max_mojibake: int = 0) -> None:
        super().__init__()
        unknown = set(scripts) - set(SCRIPTS)
        if unknown:
            raise ValueError(f"unknown scripts {sorted(unknown)}; known: {sorted(SCRIPTS)}")
        self.scripts = [SCRIPTS[s] for s in scripts]
        self.latin = "latin" in scripts or min_script_ratio <= 0
        self.min_script_ratio, self.max_mojibake = min_script_ratio, max_mojibake
        self.stats.extra.update(scripts=list(scripts), min_script_ratio=min_script_ratio)

    def process(self, record: Record) -> Record | str:
        t = record.text
        if _CONTROL.search(t):
            return "control_chars"
        if t.isascii():  # fast path: no mojibake possible, every letter is Latin
            return record if self.latin else "wrong_script"
        if len(_MOJIBAKE.findall(t)) > self.max_mojibake:
            return "mojibake"
        letters = len(_LETTER.findall(t))
        if letters:
            ok = sum(len(p.findall(t)) for p in self.scripts)
            if ok / letters < self.min_script_ratio:
                return "wrong_script"
        return record


class SymbolFilter(Step):
    """Drop text dominated by symbols (markup, tables of operators) or by digits."""

    name = "symbols"

    def __init__(self, max_symbol_ratio: float = 0.25, max_digit_ratio: float = 0.3) -> None:
        super().__init__()
        self.max_symbol_ratio, self.max_digit_ratio = max_symbol_ratio, max_digit_ratio
        self.stats.extra.update(max_symbol_ratio=max_symbol_ratio, max_digit_ratio=max_digit_ratio)

    def process(self, record: Record) -> Record | str:
        t = record.text
        visible = len("".join(t.split()))
        if visible == 0:
            return "symbol_ratio"
        if t.isascii():  # byte-level counting: far faster than per-character Python
            b = t.encode("ascii")
            symbols = len(b.translate(None, _ASCII_NOT_SYMBOL))
            digits = len(b) - len(b.translate(None, _ASCII_DIGITS))
        else:
            symbols = sum(1 for c in _SPACE_OR_WORD.sub("", t) if c not in _PUNCT
                          and not unicodedata.category(c).startswith("M"))
            digits = len(_DIGIT.findall(t))
        if symbols / visible > self.max_symbol_ratio:
            return "symbol_ratio"
        if digits / visible > self.max_digit_ratio:
            return "digit_ratio"
        return record


class RepetitionFilter(Step):
    """Gopher repetition rules: duplicate lines and dominant word n-grams."""

    name = "repetition"
    TOP_NGRAM = {2: 0.20, 3: 0.18, 4: 0.16}

    def __init__(self, max_dup_line_fraction: float = 0.3, max_dup_line_chars: float = 0.2,
                 top_ngram: dict[int, float] | None = None, min_words: int = 50) -> None:
        super().__init__()
        self.max_dup_lines, self.max_dup_chars = max_dup_line_fraction, max_dup_line_chars
        self.top_ngram = dict(self.TOP_NGRAM if top_ngram is None else top_ngram)
        self.min_words = min_words  # below this, n-gram statistics mean nothing
        self.stats.extra.update(max_dup_line_fraction=max_dup_line_fraction,
                                max_dup_line_chars=max_dup_line_chars,
                                top_ngram={str(n): v for n, v in self.top_ngram.items()})

    def process(self, record: Record) -> Record | str:
        lines = [line for line in record.text.split("\n") if line.strip()]
        if len(lines) > 1:
            seen: set[str] = set()
            dup, dup_chars = 0, 0
            for line in lines:
                if line in seen:
                    dup, dup_chars = dup + 1, dup_chars + len(line)
                seen.add(line)
            if dup / len(lines) > self.max_dup_lines:
                return "dup_line_fraction"
            if dup_chars / sum(map(len, lines)) > self.max_dup_chars:
                return "dup_line_chars"
        ws = words(record.text)
        if len(ws) >= self.min_words:
            total = sum(map(len, ws))
            for n, limit in self.top_ngram.items():
                grams = Counter(zip(*(ws[i:] for i in range(n))))  # n-gram tuples, built in C
                gram, count = grams.most_common(1)[0]
                if count > 1 and count * sum(map(len, gram)) / total > limit:
                    return "top_ngram"
        return record


@dataclass(frozen=True)
class QualityParams:
    """The quality-filter chain's settings, built from [data] by `data.options.quality_params` (the defaults
    and their meaning live there, in config.DataConfig, only).

    The perplexity filter runs only when `perplexity_reference` names reference inputs
    (JSONL / text files, read like pipeline inputs, up to `perplexity_max_chars`).
    """

    min_words: int
    max_words: int
    scripts: tuple[str, ...]
    min_script_ratio: float
    max_symbol_ratio: float
    max_digit_ratio: float
    repetition: bool
    perplexity_reference: tuple[str, ...]
    perplexity_percentile: float
    perplexity_order: int
    perplexity_max_chars: int

    def steps(self) -> list[Step]:
        out: list[Step] = [WordCountFilter(self.min_words, self.max_words),
                           CharsetFilter(tuple(self.scripts), self.min_script_ratio),
                           SymbolFilter(self.max_symbol_ratio, self.max_digit_ratio)]
        if self.repetition:
            out.append(RepetitionFilter())
        if self.perplexity_reference:
            out.append(PerplexityFilter(self.reference_texts(), self.perplexity_percentile, self.perplexity_order))
        return out

    def reference_texts(self) -> list[str]:
        texts, budget = [], self.perplexity_max_chars
        for r in read_inputs(list(self.perplexity_reference), Rejects()):
            texts.append(normalize_text(r.text))
            budget -= len(r.text)
            if budget <= 0:
                break
        return texts
