"""Near-duplicate detection: signatures -> LSH candidates -> verified pairs -> clusters,
and `NearDupIndex`, the reusable "is a near copy of this text in that corpus?" API.

Verification (why it matters): banding at 0.85 is tuned to *see* nearly every pair
at the threshold (`lsh.optimal_bands(..., min_recall=0.999)`), which also lets through
many pairs below it. Each candidate is therefore checked:

1. estimated Jaccard from the full signatures (vectorised over all candidates);
   with ``verify="estimate"`` a pair counts when the estimate is >= threshold;
2. with ``verify="exact"`` (the default where texts are at hand) pairs whose estimate
   is within `EXACT_MARGIN` standard deviations below the threshold get the exact
   Jaccard of their shingle sets, and count when that is >= threshold. The estimate
   has sd ~0.03 at 0.85, so without this step pairs just above the threshold would
   be missed about half the time.

Clusters come from union-find over the verified pairs; a cluster's root is its
smallest index (first in input order), the deterministic survivor.

`NearDupIndex` keeps signatures plus, per band, the sorted band keys, so a query is
a `np.searchsorted` per band: the evaluation layer builds one from ``train.jsonl``
(`NearDupIndex.from_jsonl`) and asks `contains(texts)` / `query(texts)`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from tinystack.data.lsh import band_candidates, band_keys, optimal_bands, unique_pairs
from tinystack.data.minhash import MinHasher, MinHashParams, jaccard_std
from tinystack.data.shingles import Unit, exact_jaccard, shingle_set
from tinystack.data.unionfind import UnionFind

EXACT_MARGIN = 4.0  # standard deviations below the threshold still sent to the exact check
_EXACT_CHUNK = 1024  # pairs whose shingle sets are held at once during exact verification
_VERIFY_CHUNK = 1 << 13  # candidate pairs compared per vectorised batch (~8 MiB of gathered rows)


@dataclass(frozen=True)
class NearDupParams:
    """Parameters of near dedup. ``verify``: "exact" | "estimate" (see module doc)."""

    threshold: float = 0.85
    num_perm: int = 128
    k: int = 3
    unit: Unit = "char"
    casefold: bool = True
    seed: int = 1
    min_recall: float = 0.999
    verify: str = "exact"

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        if self.verify not in ("exact", "estimate"):
            raise ValueError(f"verify must be 'exact' or 'estimate', got {self.verify!r}")

    @property
    def minhash(self) -> MinHashParams:
        return MinHashParams(self.num_perm, self.k, self.unit, self.casefold, self.seed)

    @property
    def bands(self) -> tuple[int, int]:
        return optimal_bands(self.threshold, self.num_perm, 0.5, 0.5, self.min_recall)

    @property
    def estimate_floor(self) -> float:
        """Lowest estimate that can still be a true pair under exact verification."""
        if self.verify == "estimate":
            return self.threshold
        return self.threshold - EXACT_MARGIN * jaccard_std(self.threshold, self.num_perm)


TextsOf = Callable[[np.ndarray], dict[int, str]]  # indices -> {index: text}


def estimate_pairs(sig_a: np.ndarray, sig_b: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Estimated Jaccard of each (i, j) in `pairs`: rows of `sig_a` vs rows of `sig_b`."""
    out = np.empty(len(pairs), dtype=np.float64)
    for s in range(0, len(pairs), _VERIFY_CHUNK):
        p = pairs[s : s + _VERIFY_CHUNK]
        out[s : s + len(p)] = (sig_a[p[:, 0]] == sig_b[p[:, 1]]).mean(axis=1)
    return out


def verify_pairs(pairs: np.ndarray, est: np.ndarray, params: NearDupParams,
                 texts_a: TextsOf | None, texts_b: TextsOf | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Keep the true pairs; return (pairs, jaccard) where jaccard is exact when computed."""
    keep = est >= params.estimate_floor
    pairs, est = pairs[keep], est[keep]
    if params.verify == "estimate" or texts_a is None or len(pairs) == 0:
        ok = est >= params.threshold
        return pairs[ok], est[ok]
    jac = np.concatenate([_exact_chunk(pairs[c : c + _EXACT_CHUNK], est[c : c + _EXACT_CHUNK], params,
                                       texts_a, texts_b) for c in range(0, len(pairs), _EXACT_CHUNK)])
    ok = jac >= params.threshold
    return pairs[ok], jac[ok]


def _exact_chunk(pairs: np.ndarray, est: np.ndarray, params: NearDupParams, texts_a: TextsOf,
                 texts_b: TextsOf | None) -> np.ndarray:
    """Exact Jaccard for one chunk of pairs (bounded memory: only this chunk's shingle sets)."""
    p = params
    sets = lambda txt: {i: shingle_set(t, p.k, p.unit, p.casefold) for i, t in txt.items()}
    if texts_b is None:  # both sides index the same collection: one read, one shingling
        sa = sb = sets(texts_a(np.unique(pairs)))
    else:
        sa, sb = sets(texts_a(np.unique(pairs[:, 0]))), sets(texts_b(np.unique(pairs[:, 1])))
    # A pair whose text is not available (an index built with keep_texts=False) keeps its estimate.
    return np.array([exact_jaccard(sa[i], sb[j]) if i in sa and j in sb else e
                     for (i, j), e in zip(pairs.tolist(), est.tolist())], dtype=np.float64)


def find_pairs(sigs: np.ndarray, params: NearDupParams, texts_of: TextsOf | None = None,
               stats: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Verified near-duplicate pairs (i < j) among the rows of `sigs`, with their Jaccard.

    Band by band, candidates are screened by their estimate right away, so memory
    holds one band's candidates, not all of them: with character 3-grams, unrelated
    documents of one language share many shingles (Jaccard ~0.2-0.3), and a few of
    the billions of such pairs collide in every band. `stats` (if given) receives
    ``candidate_pairs`` (summed over bands) and ``screened_pairs``.
    """
    b, r = params.bands
    keys = band_keys(sigs, b, r)
    n, kept, total = len(sigs), [], 0
    floor = params.estimate_floor
    for band in range(b):
        cand = band_candidates(keys, band)
        total += len(cand)
        est = estimate_pairs(sigs, sigs, cand)
        kept.append(cand[est >= floor])
    cand = unique_pairs(np.concatenate(kept), n) if kept else np.zeros((0, 2), dtype=np.int64)
    if stats is not None:
        stats.update(candidate_pairs=int(total), screened_pairs=int(len(cand)))
    return verify_pairs(cand, estimate_pairs(sigs, sigs, cand), params, texts_of)


def cluster_roots(n: int, pairs: np.ndarray) -> np.ndarray:
    """Cluster representative (smallest member index) of each of n items."""
    uf = UnionFind(n)
    uf.union_pairs(pairs)
    return uf.roots()


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
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # per band: keys, order

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

    def add_jsonl(self, path: str | Path, text_field: str = "text") -> int:
        """Index every line's `text_field`; keep only byte offsets (texts are re-read on
        demand for exact verification). Returns the number of records added."""
        path = Path(path)
        offsets: list[int] = []

        def texts() -> Iterator[str]:
            with open(path, "rb") as f:
                pos = 0
                for line in f:
                    if line.strip():
                        offsets.append(pos)
                        yield json.loads(line)[text_field]
                    pos += len(line)

        first = len(self)
        self._adding_file = True
        try:
            self.add(texts())
        finally:
            self._adding_file = False
        self._files.append((first, path, text_field, np.asarray(offsets, dtype=np.int64)))
        return len(offsets)

    @classmethod
    def from_jsonl(cls, path: str | Path, params: NearDupParams | None = None, text_field: str = "text") -> "NearDupIndex":
        """An index over the `text_field` of every line of a JSONL file (e.g. a train split)."""
        idx = cls(params or NearDupParams())
        idx.add_jsonl(path, text_field)
        return idx

    @property
    def signatures(self) -> np.ndarray:
        if len(self._sigs) > 1:
            self._sigs = [np.concatenate(self._sigs)]
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
            keys = band_keys(self.signatures, b, r)
            order = np.argsort(keys, axis=0, kind="stable")
            self._sorted = (np.take_along_axis(keys, order, axis=0), order)
        return self._sorted

    def query(self, texts: Sequence[str]) -> list[Match | None]:
        """For each text, its most similar verified near duplicate in the index, or None."""
        texts = list(texts)
        out: list[Match | None] = [None] * len(texts)
        if not texts or len(self) == 0:
            return out
        qsig = self.hasher.signatures(texts)
        skeys, order = self._band_index()
        b, r = self.params.bands
        qkeys = band_keys(qsig, b, r)
        found = []
        for band in range(b):
            lo = np.searchsorted(skeys[:, band], qkeys[:, band], side="left")
            hi = np.searchsorted(skeys[:, band], qkeys[:, band], side="right")
            counts = hi - lo
            if counts.sum() == 0:
                continue
            q = np.repeat(np.arange(len(texts)), counts)
            pos = np.concatenate([np.arange(a, z) for a, z in zip(lo[counts > 0], hi[counts > 0])])
            found.append(np.stack([q, order[pos, band]], axis=1))
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
