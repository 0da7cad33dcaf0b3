"""MinHash signatures, vectorised over whole batches of documents.

A document's signature is, for each of `num_perm` hash functions h_i, the minimum of
h_i over its shingle hashes. For two documents, P[min h_i(A) == min h_i(B)] = J(A, B)
(the Jaccard similarity of their shingle sets), so the share of equal signature
positions estimates J with standard deviation sqrt(J(1-J)/num_perm).

The permutation family is the universal hash family

    h_i(x) = (a_i * x + b_i) mod 2**32        a_i odd, x = top 32 bits of a mixed shingle hash

i.e. ``(a*x + b) mod p`` with p = 2**32, where the modulo is free (uint32 wrap-around)
and, a_i being odd, each h_i is a bijection of the 32-bit space. x has already been
through a full-avalanche mixer (`shingles.mix64`), which is what makes this cheap
family behave like random permutations (the estimate-vs-exact benchmark checks it).

Where the time goes, and why the code is shaped this way (Chinese ~2,000-char
documents have ~2,000 distinct 3-grams, so 256k (permutation, shingle) values each):

* Shingling is batched (`shingles.shingle_hashes_batch`): one encode and one pass of
  array operations for a group of texts, instead of ~15 small NumPy calls per text.
* Repeated shingles cannot change a minimum, so a long document's are removed first
  (`shingles.sorted_unique`; English text repeats ~60 % of the 3-grams of 2,000
  characters). A short one keeps them (~13 % at ~330 characters): the per-document
  sort would cost more than the permutation work it saves (`_DISTINCT_FROM`).
* The permutation step runs on tiles of `_PBLOCK` permutations x `_CHUNK` shingles
  (several documents packed together): multiply, add (both in place, wrapping
  uint32) and a segmented minimum (`np.minimum.reduceat`) per tile. A 512 KiB tile
  stays in the core's L2 cache across the three passes; one (128 x 8k) tile of
  4 MiB does not, and made the step slower. Tiles also keep the broadcast's
  inner dimension >= 4k elements, below which NumPy's per-row overhead dominates.
  32-bit arithmetic moves half the bytes of 64-bit and needs no modulo at all.

Determinism: a_i and b_i come from splitmix64 of (seed, i), pure integer arithmetic,
so signatures are identical across runs, processes, NumPy versions, machines and
batchings (a row depends only on its text). Signatures are uint32: 128 permutations
cost 512 bytes a document.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tinystack.data.dedup.shingles import Unit, canonical_batch, canonical_shingle_hashes, mix64, sorted_unique

EMPTY = np.uint32(0xFFFFFFFF)  # signature value of a document with no shingles
_CHUNK = 1 << 13  # shingles per tile (several documents packed together)
_PBLOCK = 16  # permutations per tile: 16 x 8k x 4 B = 512 KiB, fits in L2
_GROUP_CHARS = 1 << 15  # characters of text shingled in one batch
_DISTINCT_FROM = 1024  # shingles from which a document's repeats are removed before the permutations
_HIGH = 1 if sys.byteorder == "little" else 0  # which uint32 half of a uint64 holds its top bits


@dataclass(frozen=True)
class MinHashParams:
    """Everything that determines a signature. Equal params <=> comparable signatures."""

    num_perm: int = 128
    k: int = 3
    unit: Unit = "char"
    casefold: bool = True
    seed: int = 1


class MinHasher:
    """Computes signatures for `MinHashParams`. Cheap to build; safe to pickle to workers."""

    def __init__(self, params: MinHashParams | None = None) -> None:
        self.params = p = params or MinHashParams()
        if p.num_perm < 1:
            raise ValueError(f"num_perm must be >= 1, got {p.num_perm}")
        idx = np.arange(2 * p.num_perm, dtype=np.uint64) + np.uint64(p.seed % (1 << 32)) * np.uint64(1 << 32)
        coeffs = mix64(mix64(idx))
        self.a = ((coeffs[0::2] >> np.uint64(32)).astype(np.uint32) | np.uint32(1))[:, None]  # odd, (P, 1)
        self.b = (coeffs[1::2] >> np.uint64(32)).astype(np.uint32)[:, None]

    def shingles(self, text: str) -> np.ndarray:
        """Distinct 32-bit shingle keys of `text` (the input of the permutation step)."""
        return self.shingles_batch([text])[0]

    def shingles_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`shingles` of each text (batched shingling; same values)."""
        x, counts = self._keys(canonical_batch(texts, self.params.casefold), distinct_from=0)
        return np.split(x, np.cumsum(counts)[:-1]) if len(counts) else []

    def _keys(self, canon: list[str], distinct_from: int = _DISTINCT_FROM) -> tuple[np.ndarray, np.ndarray]:
        """(32-bit keys of every text, concatenated; count per text) of canonical texts: the
        top 32 bits of each shingle hash, made distinct (sorted) for the texts with at least
        `distinct_from` shingles. Repeats cannot change a minimum, so removing them only
        pays where it saves more permutation work than the sort costs (see module doc)."""
        p = self.params
        h, counts = canonical_shingle_hashes(canon, p.k, p.unit)
        x = h.view(np.uint32)[_HIGH::2]  # a strided view: the top halves
        if not (counts >= distinct_from).any():
            return np.ascontiguousarray(x), counts
        parts = [sorted_unique(x[e - c : e]) if c >= distinct_from else x[e - c : e]
                 for e, c in zip(np.cumsum(counts).tolist(), counts.tolist())]
        return np.concatenate(parts), np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), num_perm) uint32 signatures, one row per text, in order."""
        return self.signatures_canonical(canonical_batch(texts, self.params.casefold))

    def signatures_canonical(self, canon: Sequence[str]) -> np.ndarray:
        """`signatures` of texts already in canonical form (`shingles.canonical_batch` with
        this hasher's ``casefold``), for callers that need the canonical text anyway."""
        canon = list(canon)
        out = np.full((len(canon), self.params.num_perm), EMPTY, dtype=np.uint32)
        buf = np.empty(_PBLOCK * _CHUNK, dtype=np.uint32)
        start = 0
        while start < len(canon):  # groups of texts of ~_GROUP_CHARS characters
            stop, chars = start, 0
            while stop < len(canon) and (stop == start or chars + len(canon[stop]) <= _GROUP_CHARS):
                chars += len(canon[stop])
                stop += 1
            self._sign(*self._keys(canon[start:stop]), out[start:stop], buf)
            start = stop
        return out

    def signatures_from_shingles(self, hashes: Sequence[np.ndarray]) -> np.ndarray:
        """Signatures from precomputed shingle keys (as returned by `shingles`)."""
        out = np.full((len(hashes), self.params.num_perm), EMPTY, dtype=np.uint32)
        counts = np.fromiter(map(len, hashes), dtype=np.int64, count=len(hashes))
        x = np.concatenate(hashes) if len(hashes) else np.zeros(0, np.uint32)
        self._sign(x, counts, out, np.empty(_PBLOCK * _CHUNK, dtype=np.uint32))
        return out

    def _sign(self, x: np.ndarray, counts: np.ndarray, out: np.ndarray, buf: np.ndarray) -> None:
        """Fill `out` (rows of EMPTY) with the signatures of the documents whose keys are the
        consecutive segments of `x` (counts[i] keys for row i), packing whole documents
        into tiles of up to _CHUNK keys (the keys are already contiguous: no copy)."""
        ends = np.cumsum(counts)
        n, start = len(counts), 0
        while start < n:
            lo = ends[start] - counts[start]
            # the last document that still fits in a tile that starts at document `start`
            stop = max(start + 1, int(np.searchsorted(ends, lo + _CHUNK, side="right")))
            c = counts[start:stop]
            nonempty = np.flatnonzero(c)
            seg, row = x[lo : ends[stop - 1]], out[start:stop]
            if len(nonempty) == 1 and len(seg) > _CHUNK:  # one long document:
                row = row[nonempty[0]]  # running minimum over its pieces
                for s in range(0, len(seg), _CHUNK):
                    np.minimum(row, self._tile_min(seg[s : s + _CHUNK], np.zeros(1, np.int64), buf)[0], out=row)
            elif len(nonempty):
                starts = np.cumsum(c[nonempty]) - c[nonempty]
                row[nonempty] = self._tile_min(seg, starts, buf)
            start = stop

    def _tile_min(self, x: np.ndarray, starts: np.ndarray, buf: np.ndarray) -> np.ndarray:
        """(len(starts), P): per segment of x (segments begin at `starts`), the minimum
        of every h_i, computed _PBLOCK permutations at a time in the reused `buf`."""
        P = len(self.a)
        res = np.empty((len(starts), P), dtype=np.uint32)
        for p0 in range(0, P, _PBLOCK):
            a, b = self.a[p0 : p0 + _PBLOCK], self.b[p0 : p0 + _PBLOCK]
            h = buf[: len(a) * len(x)].reshape(len(a), len(x))
            np.multiply(a, x, out=h)  # (block, shingles), wraps mod 2**32
            np.add(h, b, out=h)
            res[:, p0 : p0 + len(a)] = np.minimum.reduceat(h, starts, axis=1).T
        return res


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray | float:
    """Share of equal positions; works row-wise on (n, P) arrays or on two (P,) rows."""
    eq = np.asarray(sig_a) == np.asarray(sig_b)
    return eq.mean(axis=-1)


def jaccard_std(j: float, num_perm: int) -> float:
    """Standard deviation of the MinHash estimate at true Jaccard j: sqrt(j(1-j)/P)."""
    return math.sqrt(max(j * (1 - j), 0.0) / num_perm)


def estimate_interval(j: np.ndarray | float, num_perm: int, sigmas: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Exact central interval [lo, hi] of the estimate at true Jaccard j that holds the
    probability mass of +-`sigmas` standard deviations of a normal (99.73 % for 3).

    Under ideal hashing the number of equal positions is Binomial(num_perm, j), and
    "within 3 sd of j" is the normal approximation of this interval. The approximation
    fails where num_perm * j * (1 - j) is small: at j = 0.01 the count is Poisson-like
    (mean 1.3), j + 3 sd excludes 5 matches, and 1 % of estimates land there by pure
    chance; at j = 0 or 1 the sd is 0 and only an exact estimate would "pass". The
    binomial quantiles are the exact statement: lo = the smallest count whose CDF
    reaches (1 - mass) / 2, hi = the smallest whose CDF reaches (1 + mass) / 2, so
    P(lo <= count <= hi) >= mass for every j. Returns the bounds as estimates (count / P).
    """
    j = np.clip(np.atleast_1d(np.asarray(j, dtype=np.float64)), 0.0, 1.0)
    mass = math.erf(sigmas / math.sqrt(2.0))
    x = np.arange(num_perm + 1)
    log_c = np.array([math.lgamma(num_perm + 1) - math.lgamma(i + 1) - math.lgamma(num_perm - i + 1) for i in x])
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = log_c + x * np.log(j)[:, None] + (num_perm - x) * np.log1p(-j)[:, None]
    logp = np.where(np.isnan(logp), -np.inf, logp)
    logp[j == 0.0, 0] = 0.0  # 0 * log 0 = 0: all mass on 0 (or on num_perm) matches
    logp[j == 1.0, num_perm] = 0.0
    cdf = np.cumsum(np.exp(logp), axis=1)
    lo = np.argmax(cdf >= (1.0 - mass) / 2 - 1e-12, axis=1)
    hi = np.argmax(cdf >= (1.0 + mass) / 2 - 1e-12, axis=1)
    return lo / num_perm, hi / num_perm
