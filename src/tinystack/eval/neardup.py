"""The one place evaluation asks the data layer "does a near duplicate of this text sit in train?".

Near duplicates are judged by the data layer's MinHash-LSH index
(`tinystack.data.dedup.index.NearDupIndex`): LSH candidates, then the Jaccard
similarity of the two texts' character-shingle sets, verified exactly near the
threshold. Evaluation never computes a similarity of its own; if the index API
changes, only this file changes.
"""
from __future__ import annotations

from typing import Sequence

from tinystack.data.dedup.index import NearDupIndex
from tinystack.data.dedup.near_duplicates import NearDupParams


def find_near_duplicates(train_texts: Sequence[str], query_texts: Sequence[str],
                         threshold: float = 0.8) -> list[tuple[int, float] | None]:
    """For each query text: (index into train_texts, Jaccard) of its most similar train text
    when that similarity is >= threshold, else None."""
    if not train_texts or not query_texts:
        return [None] * len(query_texts)
    index = NearDupIndex(NearDupParams(threshold=threshold))
    index.add(train_texts)
    return [None if m is None else (int(m.index), float(m.jaccard)) for m in index.query(query_texts)]
