"""Exact deduplication: drop every record whose normalised text was already seen.

Key = SHA-256 of the UTF-8 bytes of the canonical text (`exact_key`: NFKC, collapsed
whitespace, case folding optional; the same canonical form the MinHash shingles
use, so "exact duplicate" and "Jaccard 1.0" agree). Why SHA-256 and not
Python's `hash()`: `hash(str)` is salted per process (PYTHONHASHSEED), so it is not
reproducible across runs, and 64 bits invite collisions at scale; a cryptographic
digest is stable everywhere and a collision (two different texts treated as one) is
not a practical concern. Only the 32-byte digests are kept in memory, not the texts.

The *first* occurrence in input order is kept, so the result is deterministic for a
given input order. Dedup runs before the split, so no exact duplicate can end up in
two splits (which would leak training text into validation/test).

Near-duplicate removal (MinHash + LSH) is `near_dedup.NearDedup`, chained after this
step; with ``exact=True`` it also does this step's job and puts each exact duplicate
in its original's cluster (the ``dedup`` command).
"""
from __future__ import annotations

import hashlib

from tinystack.data.clean import normalize_text
from tinystack.data.shingles import canonical
from tinystack.data.records import Record
from tinystack.data.steps import Step


def text_sha256(text: str) -> bytes:
    """32-byte SHA-256 digest of `normalize_text(text)` (NFC; the baseline key)."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).digest()


def exact_key(text: str, casefold: bool = False) -> bytes:
    """The exact-dedup key: SHA-256 of the canonical text (NFKC, every whitespace run
    collapsed to one space, optionally case-folded; `shingles.canonical`), so texts
    that differ only in compatibility forms, layout or (optionally) case are one text."""
    return hashlib.sha256(canonical(text, casefold).encode("utf-8")).digest()


class ExactDedup(Step):
    """Keep the first record of each distinct normalised text; drop the rest.

    Drop reason: ``exact_duplicate``. ``stats.extra``:
      * ``duplicate_groups``: distinct texts that occurred more than once,
      * ``cross_source``: dropped duplicates whose kept copy has a different source
        (boilerplate shared between sources rather than repeats within one).
    """

    name = "exact_dedup"

    def __init__(self, casefold: bool = False) -> None:
        super().__init__()
        self.casefold = casefold
        self._first_source: dict[bytes, str] = {}  # digest -> source of the kept copy
        self._groups: set[bytes] = set()
        self.stats.extra.update(duplicate_groups=0, cross_source=0)

    def process(self, record: Record) -> Record | str:
        key = exact_key(record.text, self.casefold)
        first = self._first_source.get(key)
        if first is None:
            self._first_source[key] = record.source
            return record
        if key not in self._groups:
            self._groups.add(key)
            self.stats.extra["duplicate_groups"] += 1
        if first != record.source:
            self.stats.extra["cross_source"] += 1
        return "exact_duplicate"
