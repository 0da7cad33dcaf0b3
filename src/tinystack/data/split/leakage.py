"""Cross-split leakage removal: a val record with a near duplicate in train, or a test
record with one in train or in the kept val records, is dropped (reasons
``leak_near_train`` / ``leak_near_val``; train is never filtered).

The index is `dedup.index.NearDupIndex` over the *written* split files (texts are re-read
from them for exact verification, by byte offset). Its signatures come from one of two
places:

* **reused** (`adopt`): the near-dedup step already signed every surviving record
  with the same MinHash parameters. Each record carries ``cluster_id`` = its position
  in that step's input, which finds its signature row. The val and test rows are
  copied out (about 10 % of the rows), then the train rows are compacted *in place*
  to the front of the dedup step's matrix, which becomes the train index: no text is
  hashed twice and no second copy of the train signatures is made. Compaction is
  safe in place because train keeps input order, so row k moves to a position <= k.
* **computed** (no near-dedup step, the Ray engine, or different parameters): the
  index hashes the split files as it reads them, and queries hash their texts.

Both give the same signatures (a signature is a pure function of the text and the
parameters), so both give the same decisions. A test record matching both train and
val is counted as ``leak_near_train`` (train is checked first).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from tinystack.data.dedup.index import NearDupIndex
from tinystack.data.dedup.near_duplicates import NearDupParams
from tinystack.data.io.records import Record
from tinystack.data.steps import StepStats

LEAK_BATCH = 2048  # val/test records queried against the index at a time
_COMPACT_CHUNK = 4096  # rows moved per step of the in-place compaction


def compact_rows(buf: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``buf[:len(rows)] = buf[rows]`` in place, for strictly increasing `rows`, moving
    chunks of rows (so the temporary is one chunk, not a second matrix). Returns the view.
    A later chunk only reads rows >= its own start, which no earlier chunk has written."""
    if len(rows) > 1 and not (np.diff(rows) > 0).all():
        raise ValueError("compact_rows needs strictly increasing rows")
    for s in range(0, len(rows), _COMPACT_CHUNK):
        chunk = rows[s : s + _COMPACT_CHUNK]  # all >= s: gathered before anything is written
        buf[s : s + len(chunk)] = buf[chunk]
    return buf[: len(rows)]


class LeakageCheck:
    """Builds the train (then val) index and filters val and test (see module doc)."""

    def __init__(self, params: NearDupParams, stats: StepStats) -> None:
        self.params, self.stats = params, stats
        self.train = NearDupIndex(params)
        self.val = NearDupIndex(params)
        self._sigs: dict[str, np.ndarray] = {}  # split -> signatures of its records, in order (reused)
        self._kept_val: list[int] = []  # positions of the val records that survived

    def adopt(self, signatures: np.ndarray, signature_rows: np.ndarray, cluster_ids: dict[str, np.ndarray]) -> None:
        """Reuse the near-dedup step's signatures. `cluster_ids[split]`: the ``cluster_id``
        of each record routed to that split, in order (= its row's input position)."""
        pos = {k: np.searchsorted(signature_rows, np.asarray(v, dtype=np.int64)) for k, v in cluster_ids.items()}
        for k, p in pos.items():
            if len(p) and (len(signature_rows) == 0 or p.max() >= len(signature_rows)
                           or not (signature_rows[p] == np.asarray(cluster_ids[k])).all()):
                raise ValueError(f"{k}: records without a near-dedup signature; cannot reuse signatures")
        self._sigs = {k: signatures[pos[k]] for k in ("val", "test")}  # copies, ~10 % of the rows
        train = pos["train"]
        increasing = len(train) < 2 or bool((np.diff(train) > 0).all())
        self._sigs["train"] = compact_rows(signatures, train) if increasing else signatures[train]

    def index(self, split: str, path: Path) -> None:
        """Add a written split file (train, or the kept val records) to its index."""
        sigs = self._sigs.pop(split, None)
        if split == "val" and sigs is not None:
            sigs = sigs[np.asarray(self._kept_val, dtype=np.int64)]
        (self.train if split == "train" else self.val).add_jsonl(path, signatures=sigs)

    def filter(self, split: str, records: Iterable[Record]) -> Iterator[Record]:
        """`records` of val or test (in routing order) without their leaked ones."""
        indexes = [(self.train, "leak_near_train")] + ([(self.val, "leak_near_val")] if split == "test" else [])
        sigs = self._sigs.get(split)
        at = 0
        batch: list[Record] = []
        for r in records:
            batch.append(r)
            if len(batch) == LEAK_BATCH:
                yield from self._flush(split, batch, indexes, None if sigs is None else sigs[at : at + len(batch)], at)
                at += len(batch)
                batch = []
        yield from self._flush(split, batch, indexes, None if sigs is None else sigs[at : at + len(batch)], at)

    def _flush(self, split: str, batch: list[Record], indexes: list[tuple[NearDupIndex, str]],
               sigs: np.ndarray | None, at: int) -> Iterator[Record]:
        reasons: list[str | None] = [None] * len(batch)
        for index, reason in indexes:
            todo = [i for i, x in enumerate(reasons) if x is None]
            if not todo or not len(index):
                continue
            found = index.query([batch[i].text for i in todo], None if sigs is None else sigs[todo])
            for i, m in zip(todo, found):
                if m is not None:
                    reasons[i] = reason
        for i, (r, reason) in enumerate(zip(batch, reasons)):
            self.stats.n_in += 1
            if reason is None:
                self.stats.kept += 1
                if split == "val":
                    self._kept_val.append(at + i)
                yield r
                continue
            self.stats.dropped[reason] += 1
            self.stats.add_example(r, reason)
            self.stats.extra["leaked"][split] += 1
