"""Text normalisation and the length filter.

`normalize_text(s)` is the one canonical form of a document. Dedup hashes it, so two
texts that differ only in line endings, trailing spaces or Unicode composition are the
same document. It is idempotent: ``normalize_text(normalize_text(s)) == normalize_text(s)``.

The rules, in order:

1. Unicode NFC: "é" typed as e + combining acute and as one code point are one text.
   (NFC, not NFKC: NFKC would rewrite "ﬁ", "²", full-width forms, i.e. change content.)
2. ``\\r\\n`` and lone ``\\r`` -> ``\\n``.
3. Trailing whitespace stripped from every line (invisible, and it varies by editor).
4. Three or more consecutive newlines -> two: one blank line still separates paragraphs.
5. Leading/trailing whitespace of the whole text stripped.

Tabs are *kept*, not expanded: the expansion width is a guess, and in code samples and
tab-separated data the tab is content. Lines are split on ``\\n`` only (not
`str.splitlines`, which would also break on form feeds and U+2028 and lose them).
"""
from __future__ import annotations

import dataclasses
import re
import unicodedata

from tinystack.data.io.records import Record
from tinystack.data.steps import Step

_MANY_NEWLINES = re.compile(r"\n{3,}")


def normalize_text(s: str) -> str:
    """Canonical form of a document (see the module docstring for the rules)."""
    s = unicodedata.normalize("NFC", s)
    s = s.replace("\r\n", "\n").replace("\r", "\n")
    s = "\n".join(line.rstrip() for line in s.split("\n"))
    s = _MANY_NEWLINES.sub("\n\n", s)
    return s.strip()


class Normalize(Step):
    """Replace each record's text by `normalize_text(text)`.

    Drops (reason ``empty_after_normalize``) only a text that normalises to nothing,
    which validated records cannot do, but the invariant must hold for any input.
    ``stats.extra["changed"]`` counts records whose text was modified.
    """

    name = "normalize"

    def __init__(self) -> None:
        super().__init__()
        self.stats.extra["changed"] = 0

    def process(self, record: Record) -> Record | str:
        text = normalize_text(record.text)
        if not text:
            return "empty_after_normalize"
        if text == record.text:
            return record
        self.stats.extra["changed"] += 1
        return dataclasses.replace(record, text=text)


class LengthFilter(Step):
    """Keep records with ``min_chars <= len(text) <= max_chars`` (characters, not bytes).

    ``max_chars <= 0`` means no upper bound. Drop reasons: ``too_short``, ``too_long``.
    Runs after `Normalize`, so whitespace padding cannot sneak a text past the minimum.
    """

    name = "length_filter"

    def __init__(self, min_chars: int = 32, max_chars: int = 20_000) -> None:
        super().__init__()
        if min_chars < 0:
            raise ValueError(f"min_chars must be >= 0, got {min_chars}")
        if max_chars > 0 and max_chars < min_chars:
            raise ValueError(f"max_chars={max_chars} < min_chars={min_chars}: nothing could pass")
        self.min_chars, self.max_chars = min_chars, max_chars
        self.stats.extra.update(min_chars=min_chars, max_chars=max_chars)

    def process(self, record: Record) -> Record | str:
        n = len(record.text)
        if n < self.min_chars:
            return "too_short"
        if self.max_chars > 0 and n > self.max_chars:
            return "too_long"
        return record
