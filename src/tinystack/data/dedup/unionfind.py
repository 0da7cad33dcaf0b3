"""Union-find (disjoint sets) over document indices 0..n-1.

The root of every set is its *smallest* index, so after any sequence of unions the
representative of a cluster is its first document in input order: that makes the
surviving document of each duplicate cluster deterministic, independent of the order
in which pairs were found. Path halving keeps `find` near O(1).
"""
from __future__ import annotations

import numpy as np


class UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, x: int) -> int:
        p = self.parent
        while p[x] != x:
            p[x] = p[p[x]]
            x = int(p[x])
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:  # the smaller index becomes the root
            if ra < rb:
                self.parent[rb] = ra
            else:
                self.parent[ra] = rb

    def union_pairs(self, pairs: np.ndarray) -> None:
        for a, b in pairs.tolist():
            self.union(a, b)

    def roots(self) -> np.ndarray:
        """Root (= smallest member) of every element, as an int64 array."""
        return np.fromiter((self.find(i) for i in range(len(self.parent))), dtype=np.int64, count=len(self.parent))
