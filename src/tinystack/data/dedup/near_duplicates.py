"""Near-duplicate detection: signatures -> LSH candidates -> verified pairs -> clusters.

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

`NearDupIndex` (index.py) is the reusable
"is a near copy of this text in that corpus?" index built on these functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tinystack.data.dedup.lsh import band_candidates, band_key, optimal_bands, unique_pairs
from tinystack.data.dedup.minhash import MinHashParams, jaccard_std
from tinystack.data.dedup.shingles import Unit, shingle_sets_batch
from tinystack.data.dedup.unionfind import UnionFind

EXACT_MARGIN = 4.0  # standard deviations below the threshold still sent to the exact check
_EXACT_PAIRS = 512  # pairs in the first chunk of exact verification
_EXACT_MIN_PAIRS = 64  # fewest pairs in a later chunk (each chunk is one pass over the texts)
_EXACT_CHARS = 1 << 21  # characters of text whose shingle sets are held at once after it (~16 MiB)
_VERIFY_VALUES = 1 << 18  # shingle hashes gathered at once when intersecting pairs' sets (~12 MiB)
_TAG_BITS = 12  # bits of a pair's number in `pair_jaccard`'s keys (groups of < 4,096 pairs)
_VERIFY_CHUNK = 1 << 12  # candidate pairs compared per vectorised batch (~4 MiB of gathered rows)


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
        # count_nonzero: .mean() would first convert the (pairs, P) booleans to float64
        out[s : s + len(p)] = np.count_nonzero(sig_a[p[:, 0]] == sig_b[p[:, 1]], axis=1) / sig_a.shape[1]
    return out


def verify_pairs(pairs: np.ndarray, est: np.ndarray, params: NearDupParams,
                 texts_a: TextsOf | None, texts_b: TextsOf | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Keep the true pairs; return (pairs, jaccard) where jaccard is exact when computed.

    Exact verification runs in chunks of pairs whose texts are fetched and shingled
    together: the first chunk has `_EXACT_PAIRS` pairs, the next ones as many as keep
    the chunk's texts near `_EXACT_CHARS` characters (from the length seen so far), so
    short documents take one or two rounds of `texts_a` (a pass over the spool each)
    and long ones stay within bounded memory."""
    keep = est >= params.estimate_floor
    pairs, est = pairs[keep], est[keep]
    if params.verify == "estimate" or texts_a is None or len(pairs) == 0:
        ok = est >= params.threshold
        return pairs[ok], est[ok]
    parts, at, size = [], 0, _EXACT_PAIRS
    while at < len(pairs):
        jac, chars = _exact_chunk(pairs[at : at + size], est[at : at + size], params, texts_a, texts_b)
        parts.append(jac)
        at += len(jac)
        size = int(min(max(_EXACT_CHARS * len(jac) / max(chars, 1), _EXACT_MIN_PAIRS), 1 << 16))
    jac = np.concatenate(parts)
    ok = jac >= params.threshold
    return pairs[ok], jac[ok]


def _exact_chunk(pairs: np.ndarray, est: np.ndarray, params: NearDupParams, texts_a: TextsOf,
                 texts_b: TextsOf | None) -> tuple[np.ndarray, int]:
    """(exact Jaccard of each pair, characters of text fetched) for one chunk of pairs.
    A pair whose text is not available (an index built with keep_texts=False) keeps its
    estimate."""
    p = params
    ta = texts_a(np.unique(pairs[:, 0] if texts_b is not None else pairs))
    tb = ta if texts_b is None else texts_b(np.unique(pairs[:, 1]))  # both sides one collection: one read
    pos_a = {i: k for k, i in enumerate(ta)}
    texts = list(ta.values())
    if texts_b is None:
        pos_b = pos_a
    else:
        pos_b = {j: len(texts) + k for k, j in enumerate(tb)}
        texts += tb.values()
    values, sizes = shingle_sets_batch(texts, p.k, p.unit, p.casefold)
    a = np.array([pos_a.get(i, -1) for i in pairs[:, 0].tolist()], dtype=np.int64)
    b = np.array([pos_b.get(j, -1) for j in pairs[:, 1].tolist()], dtype=np.int64)
    have = (a >= 0) & (b >= 0)
    jac = est.astype(np.float64)
    jac[have] = pair_jaccard(values, sizes, a[have], b[have])
    return jac, sum(map(len, texts))


def pair_jaccard(values: np.ndarray, sizes: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact Jaccard of sets a[m] and b[m] for every m, where set i is the i-th segment
    (sizes[i] values, sorted, distinct) of `values` (as from `shingles.shingle_sets_batch`).
    Same value as `exact_jaccard` (an empty pair of sets is 1.0).

    Vectorised over pairs: each value is keyed by (pair number, value) packed in 64
    bits, the pair number in the top `_TAG_BITS` and the value's top 64 - `_TAG_BITS`
    bits below it, so all b-sides form one sorted array and one `searchsorted` finds
    every common value; a hit counts only when the full values agree too. Two values
    of one b-set that share their top bits (~1e-11 for a pair of short texts) would
    hide each other: a group of pairs where that happens is counted pair by pair."""
    starts = np.cumsum(sizes) - sizes
    out = np.empty(len(a), dtype=np.float64)
    n_val = sizes[a] + sizes[b]
    ends = np.cumsum(n_val)
    m = 0
    while m < len(a):  # groups of < 2**_TAG_BITS pairs and ~_VERIFY_VALUES values
        stop = min(m + (1 << _TAG_BITS) - 1, len(a))
        stop = max(m + 1, min(stop, int(np.searchsorted(ends, ends[m] - n_val[m] + _VERIFY_VALUES, side="right"))))
        (va, ka), (vb, kb) = _keyed(values, starts, sizes, a[m:stop]), _keyed(values, starts, sizes, b[m:stop])
        if len(kb) > 1 and (kb[1:] == kb[:-1]).any():
            inter = np.array([len(np.intersect1d(values[starts[i] : starts[i] + sizes[i]],
                                                 values[starts[j] : starts[j] + sizes[j]], assume_unique=True))
                              for i, j in zip(a[m:stop].tolist(), b[m:stop].tolist())], dtype=np.int64)
        else:
            at = np.minimum(np.searchsorted(kb, ka), max(len(kb) - 1, 0))
            hit = (kb[at] == ka) & (vb[at] == va) if len(kb) else np.zeros(len(ka), dtype=bool)
            inter = np.bincount((ka[hit] >> np.uint64(64 - _TAG_BITS)).astype(np.intp), minlength=stop - m)
        union = sizes[a[m:stop]] + sizes[b[m:stop]] - inter
        out[m:stop] = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        m = stop
    return out


def _keyed(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values of segments `seg` concatenated, their keys: position in `seg` in the top
    `_TAG_BITS` bits, the value's top bits below; sorted, since each segment is)."""
    lens = sizes[seg]
    first = np.cumsum(lens) - lens
    v = values[np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts[seg] - first, lens)]
    tag = np.repeat(np.arange(len(seg), dtype=np.uint64) << np.uint64(64 - _TAG_BITS), lens)
    return v, tag | (v >> np.uint64(_TAG_BITS))


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
    n, kept, total = len(sigs), [], 0
    floor = params.estimate_floor
    for band in range(b):
        cand = band_candidates(band_key(sigs, band, r))
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
