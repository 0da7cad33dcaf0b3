"""Exact deduplication: drop every record whose normalised text was already seen.

Key = SHA-256 of the UTF-8 bytes of the canonical text (`exact_key`: NFKC, collapsed
whitespace, case folding optional; the same canonical form the MinHash shingles
use, so "exact duplicate" and "Jaccard 1.0" agree). Why SHA-256 and not
Python's `hash()`: `hash(str)` is salted per process (PYTHONHASHSEED), so it is not
reproducible across runs, and 64 bits invite collisions at scale; a cryptographic
digest is stable everywhere and a collision (two different texts treated as one) is
not a practical concern. Only digests are kept in memory, not the texts: the step
keys its table on the first 16 bytes (128 bits: a collision needs ~2**64 distinct
texts, and a 16-byte `bytes` is 49 bytes of memory instead of 65), and the source
names it stores are shared objects, one per distinct source, not one per record.

The *first* occurrence in input order is kept, so the result is deterministic for a
given input order. Dedup runs before the split, so no exact duplicate can end up in
two splits (which would leak training text into validation/test).

Near-duplicate removal (MinHash + LSH) is `near_step.NearDedup`, chained after this
step; with ``exact=True`` it also does this step's job and puts each exact duplicate
in its original's cluster (the ``dedup`` command).
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Iterator

from tinystack.data.dedup.shingles import canonical
from tinystack.data.filters.clean import normalize_text
from tinystack.data.io.records import Record
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
        self._first_source: dict[bytes, str] = {}  # 16-byte digest -> source of the kept copy
        self._sources: dict[str, str] = {}  # one shared str per distinct source
        self._groups: set[bytes] = set()
        self.stats.extra.update(duplicate_groups=0, cross_source=0)

    def __call__(self, records: Iterable[Record]) -> Iterator[Record]:
        """One stream per step. When it is exhausted the table is dropped, so the phases
        that follow in `prepare` (near-dedup pairs, the leakage index) get its memory."""
        yield from super().__call__(records)
        self._first_source, self._sources, self._groups = {}, {}, set()

    def process(self, record: Record) -> Record | str:
        key = exact_key(record.text, self.casefold)[:16]
        first = self._first_source.get(key)
        if first is None:
            self._first_source[key] = self._sources.setdefault(record.source, record.source)
            return record
        if key not in self._groups:
            self._groups.add(key)
            self.stats.extra["duplicate_groups"] += 1
        if first != record.source:
            self.stats.extra["cross_source"] += 1
        return "exact_duplicate"
