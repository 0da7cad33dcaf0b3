"""Slicing per-document scores: totals, per source, per length bucket.

Every slice is computed from the same per-document sums (nats, tokens, bytes,
correct), and each document falls in exactly one slice of a grouping, so the sums
of the slices of a grouping add back up exactly to the total; loss, perplexity,
bits per byte and accuracy are then derived from the sums (never averaged
averages, which would weight a short document like a long one).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tinystack.eval.scoring import DocScores


def summarize(nats: float, tokens: int, nbytes: int, correct: int, docs: int) -> dict[str, Any]:
    """Derived metrics of one slice from its sums."""
    loss = nats / tokens if tokens else float("nan")
    return {
        "docs": int(docs),
        "tokens": int(tokens),
        "bytes": int(nbytes),
        "nats": float(nats),
        "correct": int(correct),
        "loss": loss,
        "perplexity": math.exp(loss) if tokens else float("nan"),
        "bits_per_byte": nats / math.log(2) / nbytes if nbytes else float("nan"),
        "accuracy": correct / tokens if tokens else float("nan"),
    }


def slice_metrics(scores: DocScores, mask: np.ndarray | None = None) -> dict[str, Any]:
    m = np.ones(len(scores), dtype=bool) if mask is None else mask
    return summarize(scores.nats[m].sum(), scores.tokens[m].sum(), scores.bytes[m].sum(),
                     scores.correct[m].sum(), m.sum())


def group_metrics(scores: DocScores, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One slice per distinct key, largest total loss (nats) first."""
    keys_arr = np.asarray(keys, dtype=object)
    out = {str(k): slice_metrics(scores, keys_arr == k) for k in dict.fromkeys(keys)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["nats"]))


def length_bucket(n_tokens: int, edges: Sequence[int]) -> str:
    """'<32', '32-127', ..., '>=512' for edges [32, 128, 512] (document length in tokens)."""
    lo = 0
    for e in edges:
        if n_tokens < e:
            return f"<{e}" if lo == 0 else f"{lo}-{e - 1}"
        lo = e
    return f">={lo}"


def bucket_order(edges: Sequence[int]) -> list[str]:
    """Bucket labels from shortest to longest."""
    samples = [0, *edges]
    return [length_bucket(n, edges) for n in samples]


def split_report(scores: DocScores, sources: Sequence[str], edges: Sequence[int]) -> dict[str, Any]:
    """Total, by_source and by_length for one split's scored documents."""
    lengths = [length_bucket(int(t), edges) for t in scores.tokens]
    by_length = group_metrics(scores, lengths)
    return {
        "total": slice_metrics(scores),
        "by_source": group_metrics(scores, sources),
        "by_length": {k: by_length[k] for k in bucket_order(edges) if k in by_length},
    }
