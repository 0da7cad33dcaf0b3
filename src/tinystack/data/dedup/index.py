"""`NearDupIndex`: the reusable "is a near copy of this text in that corpus?" API.

It keeps signatures plus, per band, the sorted band keys and their order (int32 below
2**31 rows), so a query is a `np.searchsorted` per band, then the same verification
as dedup (`near_duplicates.verify_pairs`). The evaluation layer builds one from
``train.jsonl`` (`NearDupIndex.from_jsonl`) and asks `contains(texts)` /
`query(texts)`; `prepare`'s leakage check (`leakage.py`) builds one per split, from
signatures the dedup step already computed where it can (`add_jsonl(signatures=)`).
Memory with the defaults: 512 B of signature + 18 x 12 B of band index a document,
the band index built one band at a time.
"""
from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from tinystack.data.dedup.lsh import band_key, band_keys
from tinystack.data.dedup.minhash import MinHasher
from tinystack.data.dedup.near_duplicates import NearDupParams, estimate_pairs, verify_pairs


@dataclass
class Match:
    """A query's best verified match in the index: row `index`, similarity `jaccard`."""

    index: int
    jaccard: float


@dataclass
class NearDupIndex:
    """MinHash-LSH index over a corpus, queried with new texts.

    >>> idx = NearDupIndex.from_jsonl("data/train.jsonl")
    >>> idx.contains(["some eval prompt", ...])   # -> [False, True, ...]

    Exact verification needs the indexed texts: `add(texts)` keeps them in memory
    (``keep_texts=False``: estimate-only verification for those rows); `add_jsonl`
    / `from_jsonl` keep only line offsets and re-read the few lines a query needs.
    """

    params: NearDupParams = field(default_factory=NearDupParams)
    keep_texts: bool = True

    def __post_init__(self) -> None:
        self.hasher = MinHasher(self.params.minhash)
        self._sigs: list[np.ndarray] = []
        self._texts: list[str] = []  # texts added with `add` (keep_texts=True)
        self._files: list[tuple[int, Path, str, np.ndarray]] = []  # (first row, path, field, line offsets)
        self._adding_file = False
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # (bands, n): sorted keys, order

    def __len__(self) -> int:
        return sum(len(s) for s in self._sigs)

    def add(self, texts: Iterable[str], batch: int = 1024) -> None:
        buf: list[str] = []
        for t in texts:
            buf.append(t)
            if len(buf) == batch:
                self._add_batch(buf)
                buf = []
        if buf:
            self._add_batch(buf)

    def _add_batch(self, texts: list[str]) -> None:
        self._sigs.append(self.hasher.signatures(texts))
        if self.keep_texts and not self._adding_file:
            self._texts.extend(texts)
        self._sorted = None

    def add_jsonl(self, path: str | Path, text_field: str = "text", signatures: np.ndarray | None = None) -> int:
        """Index every line's `text_field`; keep only byte offsets (texts are re-read on
        demand for exact verification). Returns the number of records added.

        `signatures`: the lines' signatures, already computed with this index's
        parameters (one row per non-blank line, in order), e.g. by the dedup step:
        they are used as they are (no copy) and the texts are not hashed again."""
        path = Path(path)
        offsets = array("q")

        def texts() -> Iterator[str]:
            with open(path, "rb") as f:
                pos = 0
                for line in f:
                    if line.strip():
                        offsets.append(pos)
                        if signatures is None:
                            yield json.loads(line)[text_field]
                    pos += len(line)

        first = len(self)
        if signatures is None:
            self._adding_file = True
            try:
                self.add(texts())
            finally:
                self._adding_file = False
        else:
            for _ in texts():
                pass
            if len(signatures) != len(offsets) or signatures.shape[1:] != (self.params.num_perm,):
                raise ValueError(f"{path}: {len(offsets)} records but signatures of shape {signatures.shape}")
            self._sigs.append(signatures)
            self._sorted = None
        self._files.append((first, path, text_field, np.frombuffer(offsets, dtype=np.int64)))
        return len(offsets)

    @classmethod
    def from_jsonl(cls, path: str | Path, params: NearDupParams | None = None,
                   text_field: str = "text") -> NearDupIndex:
        """An index over the `text_field` of every line of a JSONL file (e.g. a train split)."""
        idx = cls(params or NearDupParams())
        idx.add_jsonl(path, text_field)
        return idx

    @property
    def signatures(self) -> np.ndarray:
        """All rows as one (n, num_perm) array. Blocks are merged by copying them one at a
        time into the result and dropping each, so the peak is the result plus one block."""
        if len(self._sigs) > 1:
            out = np.empty((len(self), self.params.num_perm), dtype=np.uint32)
            at, blocks = 0, self._sigs
            self._sigs = []
            while blocks:
                block = blocks.pop(0)
                out[at : at + len(block)] = block
                at += len(block)
            self._sigs = [out]
        return self._sigs[0] if self._sigs else np.zeros((0, self.params.num_perm), dtype=np.uint32)

    def _texts_of(self, idx: np.ndarray) -> dict[int, str]:
        out: dict[int, str] = {}
        for first, path, field_, offsets in self._files:
            mine = [int(i) for i in idx if first <= i < first + len(offsets)]
            if mine:
                with open(path, "rb") as f:
                    for i in mine:
                        f.seek(int(offsets[i - first]))
                        out[i] = json.loads(f.readline())[field_]
        for i in idx:
            if int(i) not in out and self._texts:
                out[int(i)] = self._texts[int(i) - self._n_file_rows(int(i))]
        return out

    def _n_file_rows(self, i: int) -> int:
        """Rows from files before row i (texts added with `add` are stored without them)."""
        return sum(len(o) for first, _, _, o in self._files if first < i)

    def _band_index(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None:
            b, r = self.params.bands
            sigs = self.signatures
            keys = np.empty((b, len(sigs)), dtype=np.uint64)
            order = np.empty((b, len(sigs)), dtype=np.int32 if len(sigs) < 2**31 else np.int64)
            for band in range(b):  # one band's key column and sort at a time
                col = band_key(sigs, band, r)
                order[band] = np.argsort(col, kind="stable")
                keys[band] = col[order[band]]
            self._sorted = (keys, order)
        return self._sorted

    def query(self, texts: Sequence[str], signatures: np.ndarray | None = None) -> list[Match | None]:
        """For each text, its most similar verified near duplicate in the index, or None.
        `signatures`: the texts' signatures if already computed (same parameters)."""
        texts = list(texts)
        out: list[Match | None] = [None] * len(texts)
        if not texts or len(self) == 0:
            return out
        qsig = self.hasher.signatures(texts) if signatures is None else signatures
        skeys, order = self._band_index()
        b, r = self.params.bands
        qkeys = band_keys(qsig, b, r)
        found = []
        for band in range(b):
            lo = np.searchsorted(skeys[band], qkeys[:, band], side="left")
            hi = np.searchsorted(skeys[band], qkeys[:, band], side="right")
            counts = hi - lo
            if counts.sum() == 0:
                continue
            q = np.repeat(np.arange(len(texts)), counts)
            pos = np.concatenate([np.arange(a, z) for a, z in zip(lo[counts > 0], hi[counts > 0])])
            found.append(np.stack([q, order[band, pos].astype(np.int64)], axis=1))
        if not found:
            return out
        pairs = np.unique(np.concatenate(found), axis=0)
        est = estimate_pairs(qsig, self.signatures, pairs)
        have_texts = self.keep_texts or bool(self._files)
        pairs, jac = verify_pairs(pairs, est, self.params,
                                  (lambda ix: {int(i): texts[i] for i in ix}) if have_texts else None,
                                  self._texts_of if have_texts else None)
        for (qi, ii), j in zip(pairs.tolist(), jac.tolist()):
            if out[qi] is None or j > out[qi].jaccard:
                out[qi] = Match(ii, j)
        return out

    def contains(self, texts: Sequence[str]) -> list[bool]:
        """True where the index holds a near duplicate (Jaccard >= threshold) of the text."""
        return [m is not None for m in self.query(texts)]
