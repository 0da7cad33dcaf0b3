"""A temporary on-disk record buffer, for steps that must see everything before
deciding anything (near dedup, the source split) without holding it in memory.

Records are appended and read back in order, as many times as needed, with their
``origin`` (which `Record` does not serialise to JSON). The file lives in the system
temp dir and disappears on `close` (or garbage collection).

Format: per batch of `BATCH` records, a pickled list of their texts, then a pickled
list of their other fields (a tuple per record), so `texts` reads only texts. Why not JSON
lines: a record would be encoded, decoded and re-validated once more per spool,
which on short documents costs more than their near-dedup signatures;
pickling a batch costs a fraction of that each way, and the file is private to this
process (an unnamed temporary file), so nothing else ever reads it. A record is
serialised when its batch is written, not when it is appended: it must not be
changed in place after `append` (a new record is fine; the steps only make new ones).
"""
from __future__ import annotations

import bisect
import pickle
import tempfile
from typing import Iterator

from tinystack.data.io.records import Record

BATCH = 256  # records per pickled batch


def _fields(r: Record) -> tuple:
    return (r.source, r.label, r.timestamp, r.id, r.extra, r.origin)  # Record's field order after text


class Spool:
    def __init__(self) -> None:
        self._f = tempfile.TemporaryFile("w+b")
        self.n = 0
        self._texts: list[str] = []
        self._buf: list[tuple] = []
        self._batches: list[tuple[int, int]] = []  # (file offset, index of its first record)

    def append(self, r: Record) -> None:
        self._texts.append(r.text)
        self._buf.append(_fields(r))
        self.n += 1
        if len(self._buf) == BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._f.seek(0, 2)
            self._batches.append((self._f.tell(), self.n - len(self._buf)))
            pickle.dump(self._texts, self._f, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(self._buf, self._f, protocol=pickle.HIGHEST_PROTOCOL)
            self._texts, self._buf = [], []

    def _batch_texts(self, b: int) -> list[str]:
        self._f.seek(self._batches[b][0])
        return pickle.load(self._f)

    def __iter__(self) -> Iterator[Record]:
        """Every record appended so far, in order (appending meanwhile is allowed; those
        records are not part of this pass)."""
        self._flush()
        for b in range(len(self._batches)):
            texts = self._batch_texts(b)
            rest = pickle.load(self._f)  # written right after the texts
            for text, fields in zip(texts, rest):
                yield Record(text, *fields)

    def texts(self, wanted: set[int]) -> dict[int, str]:
        """{index: text} for the wanted indices (only the batches that hold them are read)."""
        out: dict[int, str] = {}
        if not wanted:
            return out
        self._flush()
        firsts = [first for _, first in self._batches]
        by_batch: dict[int, list[int]] = {}
        for i in wanted:
            if 0 <= i < self.n:
                by_batch.setdefault(bisect.bisect_right(firsts, i) - 1, []).append(i)
        for b, idx in sorted(by_batch.items()):
            texts = self._batch_texts(b)
            first = self._batches[b][1]
            for i in idx:
                out[i] = texts[i - first]
        return out

    def close(self) -> None:
        self._f.close()

    def __len__(self) -> int:
        return self.n
