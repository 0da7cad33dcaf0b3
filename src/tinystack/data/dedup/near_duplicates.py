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
from tinystack.data.dedup.shingles import Unit, exact_jaccard, shingle_set
from tinystack.data.dedup.unionfind import UnionFind

EXACT_MARGIN = 4.0  # standard deviations below the threshold still sent to the exact check
_EXACT_CHUNK = 1024  # pairs whose shingle sets are held at once during exact verification
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
