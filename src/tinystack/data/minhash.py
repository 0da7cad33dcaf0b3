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
Each document's distinct shingles are taken first (`shingles.sorted_unique`): repeats cannot
change a minimum, and natural text repeats many 3-grams, so this halves the work.
The permutation runs as one broadcast over (num_perm, shingles of a batch of
documents) into a reused buffer, followed by a segmented column minimum
(`np.minimum.reduceat`): no Python loop per shingle or per permutation. 32-bit
arithmetic moves half the bytes of 64-bit, and memory bandwidth is the bottleneck.

Determinism: a_i and b_i come from splitmix64 of (seed, i), pure integer arithmetic,
so signatures are identical across runs, processes, NumPy versions and machines.
Signatures are uint32: 128 permutations cost 512 bytes a document.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tinystack.data.shingles import Unit, mix64, shingle_hashes, sorted_unique

EMPTY = np.uint32(0xFFFFFFFF)  # signature value of a document with no shingles
_CHUNK = 1 << 13  # shingles per broadcast: (128 x 8k) x 4 B = 4 MiB working set


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
        p = self.params
        return sorted_unique((shingle_hashes(text, p.k, p.unit, p.casefold) >> np.uint64(32)).astype(np.uint32))

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), num_perm) uint32 signatures, one row per text, in order."""
        return self.signatures_from_shingles([self.shingles(t) for t in texts])

    def signatures_from_shingles(self, hashes: Sequence[np.ndarray]) -> np.ndarray:
        """Signatures from precomputed shingle keys (as returned by `shingles`)."""
        n, P = len(hashes), self.params.num_perm
        out = np.full((n, P), EMPTY, dtype=np.uint32)
        buf = np.empty(P * _CHUNK, dtype=np.uint32)  # reused: fresh 8 MiB arrays cost page faults
        start = 0
        while start < n:  # pack whole documents into chunks of ~_CHUNK shingles
            stop, total = start, 0
            while stop < n and (total == 0 or total + len(hashes[stop]) <= _CHUNK):
                total += len(hashes[stop])
                stop += 1
            self._fill(hashes[start:stop], out[start:stop], buf)
            start = stop
        return out

    def _fill(self, hashes: Sequence[np.ndarray], out: np.ndarray, buf: np.ndarray) -> None:
        lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
        nonempty = np.flatnonzero(lengths)
        if len(nonempty) == 0:
            return
        x = np.concatenate([hashes[i] for i in nonempty])
        starts = np.concatenate(([0], np.cumsum(lengths[nonempty])[:-1]))
        if len(x) * len(self.a) > len(buf):  # one document longer than a chunk
            buf = np.empty(len(x) * len(self.a), dtype=np.uint32)
        h = buf[: len(x) * len(self.a)].reshape(len(self.a), len(x))
        np.multiply(self.a, x[None, :], out=h)  # (P, shingles), wraps mod 2**32
        np.add(h, self.b, out=h)
        out[nonempty] = np.minimum.reduceat(h, starts, axis=1).T


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray | float:
    """Share of equal positions; works row-wise on (n, P) arrays or on two (P,) rows."""
    eq = np.asarray(sig_a) == np.asarray(sig_b)
    return eq.mean(axis=-1)


def jaccard_std(j: float, num_perm: int) -> float:
    """Standard deviation of the MinHash estimate at true Jaccard j: sqrt(j(1-j)/P)."""
    return math.sqrt(max(j * (1 - j), 0.0) / num_perm)
