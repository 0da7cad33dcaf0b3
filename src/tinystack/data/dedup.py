"""Exact deduplication: drop every record whose normalised text was already seen.

Key = SHA-256 of the UTF-8 bytes of `normalize_text(text)`. Why SHA-256 and not
Python's `hash()`: `hash(str)` is salted per process (PYTHONHASHSEED), so it is not
reproducible across runs, and 64 bits invite collisions at scale; a cryptographic
digest is stable everywhere and a collision (two different texts treated as one) is
not a practical concern. Only the 32-byte digests are kept in memory, not the texts.

The *first* occurrence in input order is kept, so the result is deterministic for a
given input order. Dedup runs before the split, so no exact duplicate can end up in
two splits (which would leak training text into validation/test).

Extension point: near-duplicate removal (MinHash + LSH, issue #3) belongs in a sibling
module ``minhash.py`` as another `Step` subclass (e.g. ``MinHashDedup``) that the
pipeline chains after `ExactDedup`; it can reuse `normalize_text`/`text_sha256` here
and reports its drops under its own reason (e.g. ``near_duplicate``).
"""
from __future__ import annotations

import hashlib

from tinystack.data.clean import normalize_text
from tinystack.data.records import Record
from tinystack.data.steps import Step


def text_sha256(text: str) -> bytes:
    """32-byte SHA-256 digest of the normalised text (the exact-dedup key)."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).digest()


class ExactDedup(Step):
    """Keep the first record of each distinct normalised text; drop the rest.

    Drop reason: ``exact_duplicate``. ``stats.extra``:
      * ``duplicate_groups``: distinct texts that occurred more than once,
      * ``cross_source``: dropped duplicates whose kept copy has a different source
        (boilerplate shared between sources rather than repeats within one).
    """

    name = "exact_dedup"

    def __init__(self) -> None:
        super().__init__()
        self._first_source: dict[bytes, str] = {}  # digest -> source of the kept copy
        self._groups: set[bytes] = set()
        self.stats.extra.update(duplicate_groups=0, cross_source=0)

    def process(self, record: Record) -> Record | str:
        key = text_sha256(record.text)
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
