"""LSH banding: which signature pairs are worth comparing at all.

A signature of P = b * r values is cut into b bands of r rows; two documents become a
*candidate pair* when all r values of at least one band agree. At Jaccard s that
happens with probability ``1 - (1 - s**r)**b``, an S-curve. `optimal_bands` picks
(b, r) by minimising ``fp_weight * FP + fn_weight * FN``, where FP is the area under
the curve below the threshold (pairs we would compare needlessly) and FN the area
above it that the curve misses (pairs we would never see), the rule datasketch uses.

Plain minimisation at 0.85 with 128 permutations gives b=8, r=16, whose curve is
only 0.46 at s=0.85: banding alone would miss half of the pairs right at the
threshold. Because every candidate is verified afterwards (`near_duplicates.py`), banding
only has to *not miss* true pairs, so the dedup asks for ``min_recall=0.999`` at
the threshold (b=18, r=7 at 0.85) and verification throws out the extra false
candidates.

`band_key` hashes one band of every signature to one uint64 (vectorised,
deterministic; band by band, so a large index never holds all bands' keys and their
temporaries at once) and `band_candidates` groups equal keys by sorting: no dict per
band, no Python loop per document.
"""
from __future__ import annotations

from functools import cache

import numpy as np

from tinystack.data.dedup.shingles import mix64

MAX_BUCKET_PAIRS = 64  # a bucket larger than this is linked as a star (first x rest)


def candidate_probability(s: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """P(a pair of Jaccard s shares at least one band) = 1 - (1 - s**r)**b."""
    return 1.0 - (1.0 - np.asarray(s, dtype=float) ** rows) ** bands


@cache
def optimal_bands(threshold: float, num_perm: int = 128, fp_weight: float = 0.5,
                  fn_weight: float = 0.5, min_recall: float = 0.0) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimising the weighted error areas,
    among the settings whose candidate probability at `threshold` is >= `min_recall`.

    ``min_recall=0`` is the plain datasketch rule. The dedup default (0.999) is what
    a verified pipeline wants: near-certain to see every pair at the threshold, and
    among such settings the one with the fewest false candidates.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    grid = np.linspace(0.0, 1.0, 1001)
    lo, hi = grid <= threshold, grid >= threshold
    best, best_err = (1, num_perm), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            if candidate_probability(threshold, b, r) < min_recall:
                continue
            p = candidate_probability(grid, b, r)
            fp = np.trapezoid(p[lo], grid[lo])
            fn = np.trapezoid(1.0 - p[hi], grid[hi])
            err = fp_weight * fp + fn_weight * fn
            if err < best_err - 1e-12:
                best, best_err = (b, r), err
    return best


def band_key(sigs: np.ndarray, band: int, rows: int) -> np.ndarray:
    """(n,) uint64: band `band`'s r values of every signature folded into one well-mixed key.

    The band index is mixed in, so equal values in different bands never collide.
    One band at a time keeps the temporaries at 8 bytes a document (all bands at
    once cost ~5 x 8 x bands bytes a document in intermediate arrays).
    """
    if (band + 1) * rows > sigs.shape[1]:
        raise ValueError(f"band {band} x {rows} rows exceeds signature length {sigs.shape[1]}")
    key = np.full(sigs.shape[0], mix64(np.array([band + 1], dtype=np.uint64))[0], dtype=np.uint64)
    for j in range(band * rows, (band + 1) * rows):
        key ^= sigs[:, j]  # uint32 -> uint64 in place
        key = mix64(key)
    return key


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: `band_key` of every band (for small batches of signatures)."""
    if bands * rows > sigs.shape[1]:
        raise ValueError(f"bands*rows = {bands * rows} > signature length {sigs.shape[1]}")
    out = np.empty((sigs.shape[0], bands), dtype=np.uint64)
    for b in range(bands):
        out[:, b] = band_key(sigs, b, rows)
    return out


def _bucket_pairs(order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """All pairs inside each [start, end) run of `order`; star pairs for big runs."""
    sizes = ends - starts
    # Pairs (first, other) for every bucket: vectorised, covers buckets of size 2 (most).
    member = np.ones(len(order), dtype=bool)
    member[starts] = False
    out = [np.stack([np.repeat(order[starts], sizes - 1), order[member]], axis=1)]
    # Remaining pairs (non-first x non-first) for small buckets of size >= 3, all buckets
    # of one size at once as a 2-D block (a Python loop per bucket cost more than the pairs).
    small = (sizes >= 3) & (sizes <= MAX_BUCKET_PAIRS)
    for m in np.unique(sizes[small]).tolist():
        block = order[starts[small & (sizes == m)][:, None] + np.arange(1, m)]  # (buckets, m - 1)
        i, j = np.triu_indices(m - 1, k=1)
        out.append(np.stack([block[:, i].ravel(), block[:, j].ravel()], axis=1))
    return np.concatenate(out)


def band_candidates(keys: np.ndarray, band: int | None = None) -> np.ndarray:
    """(m, 2) int64 pairs (i < j, possibly repeated) sharing their key in one band:
    `keys` is one band's (n,) key column, or an (n, bands) matrix and `band` a column."""
    col = keys if band is None else keys[:, band]
    n = col.shape[0]
    order = np.argsort(col, kind="stable")
    sk = col[order]
    change = np.flatnonzero(sk[1:] != sk[:-1]) + 1
    starts = np.concatenate(([0], change))
    sizes = np.diff(np.concatenate((starts, [n])))
    multi = sizes >= 2
    if not multi.any():
        return np.zeros((0, 2), dtype=np.int64)
    sub = order[np.repeat(multi, sizes)]  # members of multi-member buckets only
    sizes = sizes[multi]
    sub_starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    pairs = _bucket_pairs(sub, sub_starts, sub_starts + sizes).astype(np.int64)
    return np.sort(pairs, axis=1)


def unique_pairs(pairs: np.ndarray, n: int) -> np.ndarray:
    """Distinct rows of an (m, 2) array of indices < n, sorted."""
    if len(pairs) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    code = np.unique(pairs[:, 0] * np.int64(n) + pairs[:, 1])
    return np.stack([code // n, code % n], axis=1)


def candidate_pairs(keys: np.ndarray) -> np.ndarray:
    """(m, 2) int64 array of distinct pairs (i < j) that share a key in some band.

    Holds every band's pairs at once; `near_duplicates.find_pairs` instead filters band by
    band, which keeps memory bounded when many dissimilar pairs collide.
    """
    n, bands = keys.shape
    found = [band_candidates(keys, b) for b in range(bands)]
    return unique_pairs(np.concatenate(found), n) if found else np.zeros((0, 2), dtype=np.int64)
