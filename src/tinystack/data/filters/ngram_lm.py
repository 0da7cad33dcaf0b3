"""A character n-gram language model (interpolated Kneser-Ney), built here, and the
perplexity filter that uses it.

Why characters: no tokenizer is needed, it works the same for English and Chinese,
and a 5-gram over characters already separates fluent text from boilerplate,
keyword soup and machine noise.

Model (Chen & Goodman's interpolated Kneser-Ney, one discount D per order):

    P_n(c | h) = max(C(hc) - D, 0) / C(h.)  +  D * N1+(h.) / C(h.) * P_{n-1}(c | h')

with raw counts C at the highest order and *continuation* counts N1+(.hc) (number
of distinct characters seen before hc) at the lower orders; h' is h without its
first character; a context never seen backs off entirely. The unigram level is
the continuation distribution with add-one smoothing over the vocabulary plus one
unknown symbol, so no character gets probability 0.

Everything is NumPy: an n-gram is a 64-bit polynomial key of its code points (at
every position at once), counts are `np.unique` over keys, look-ups are
`np.searchsorted`. Training on a few MB of text takes seconds and scoring is a few
array passes per document. Documents are padded with n-1 start symbols.

`PerplexityFilter` trains the model on a reference set (most of it), scores the
held-out rest, and drops records whose perplexity is above the given percentile of
the held-out perplexities: "less fluent than all but p% of clean reference text".
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from tinystack.data.io.records import Record
from tinystack.data.steps import Step

_B = np.uint64(1_000_003)  # polynomial base (prime > any code point)
_BOS = 0x2  # start-of-text symbol (STX): cannot occur in cleaned text


def _codes(text: str, n: int) -> np.ndarray:
    c = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    return np.concatenate([np.full(n - 1, _BOS, dtype=np.uint64), c + np.uint64(1)])


def _keys(codes: np.ndarray, length: int, n: int) -> np.ndarray:
    """Key of the `length`-gram ending at each predicted position (positions n-1..)."""
    m = len(codes) - (n - 1)
    key = np.full(m, np.uint64(length), dtype=np.uint64)  # the length is part of the key
    for j in range(length):
        key = key * _B + codes[n - length + j : n - length + j + m]
    return key


def _ctx_keys(codes: np.ndarray, length: int, n: int) -> np.ndarray:
    """Key of the (length-1)-character context of the `length`-gram at each position."""
    m = len(codes) - (n - 1)
    key = np.full(m, np.uint64(length - 1), dtype=np.uint64)
    for j in range(length - 1):
        key = key * _B + codes[n - length + j : n - length + j + m]
    return key


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_vals: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(table_keys, keys)
    pos = np.minimum(pos, len(table_keys) - 1)
    hit = table_keys[pos] == keys if len(table_keys) else np.zeros(len(keys), dtype=bool)
    return np.where(hit, table_vals[pos] if len(table_keys) else 0, 0)


class CharNgramLM:
    """Interpolated Kneser-Ney over characters. `fit` then `log_probs` / `perplexity`."""

    def __init__(self, order: int = 5, discount: float = 0.75) -> None:
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        self.n, self.D = order, discount

    def _positions(self, text: str) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """Per order L: key of the L-gram ending at each position, and of its (L-1)-char context."""
        c = _codes(text, self.n)
        grams = {L: _keys(c, L, self.n) for L in range(1, self.n + 1)}
        ctxs = {L: _ctx_keys(c, L, self.n) for L in range(2, self.n + 1)}
        return grams, ctxs

    def fit(self, texts: Iterable[str]) -> CharNgramLM:
        n = self.n
        g_parts: dict[int, list[np.ndarray]] = {L: [] for L in range(1, n + 1)}
        c_parts: dict[int, list[np.ndarray]] = {L: [] for L in range(2, n + 1)}
        for t in texts:
            grams, ctxs = self._positions(t)
            for L in grams:
                g_parts[L].append(grams[L])
            for L in ctxs:
                c_parts[L].append(ctxs[L])
        if not g_parts[1]:
            raise ValueError("CharNgramLM.fit: no training text")
        g = {L: np.concatenate(v) for L, v in g_parts.items()}
        h = {L: np.concatenate(v) for L, v in c_parts.items()}
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.ctx: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for L in range(1, n + 1):
            if L == n:  # raw counts
                gk, first, cnt = np.unique(g[L], return_index=True, return_counts=True)
            else:  # continuation counts: distinct (L+1)-grams whose last L characters are this gram
                _, ext_first = np.unique(g[L + 1], return_index=True)
                gk, cnt = np.unique(g[L][ext_first], return_counts=True)
                _, first = np.unique(g[L], return_index=True)  # same sorted gram set as gk
            self.tables[L] = (gk, cnt.astype(np.float64))
            if L >= 2:  # context -> (sum of its grams' counts, number of distinct followers)
                ck, inv = np.unique(h[L][first], return_inverse=True)
                self.ctx[L] = (ck, np.bincount(inv, weights=cnt).astype(np.float64),
                               np.bincount(inv).astype(np.float64))
        self.vocab = len(self.tables[1][0]) + 1  # + unknown
        self.unigram_total = float(self.tables[1][1].sum())
        return self

    def log_probs(self, text: str) -> np.ndarray:
        """Natural-log probability of each character of `text` given its history."""
        grams, ctxs = self._positions(text)
        gk, cnt = self.tables[1]
        p = (_lookup(grams[1], gk, cnt) + 1.0) / (self.unigram_total + self.vocab)
        for L in range(2, self.n + 1):
            gk, cnt = self.tables[L]
            ck, total, followers = self.ctx[L]
            c = _lookup(grams[L], gk, cnt)
            tot = _lookup(ctxs[L], ck, total)
            fol = _lookup(ctxs[L], ck, followers)
            seen = tot > 0
            safe = np.where(seen, tot, 1.0)
            p = np.where(seen, (np.maximum(c - self.D, 0.0) + self.D * fol * p) / safe, p)
        return np.log(p)

    def perplexity(self, text: str) -> float:
        lp = self.log_probs(text)
        return float(math.exp(-lp.mean())) if len(lp) else float("inf")


class PerplexityFilter(Step):
    """Drop records whose perplexity exceeds the `percentile` of held-out reference text."""

    name = "perplexity"

    def __init__(self, reference: Sequence[str], percentile: float = 99.0, order: int = 5,
                 holdout: float = 0.1) -> None:
        super().__init__()
        if not reference:
            raise ValueError("PerplexityFilter needs a non-empty reference set")
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        ref = list(reference)
        every = max(2, round(1 / holdout)) if holdout > 0 else 0
        held = ref[::every] if every and len(ref) >= 2 else ref
        train = [t for i, t in enumerate(ref) if not every or i % every] or ref
        self.lm = CharNgramLM(order).fit(train)
        self.cut = float(np.percentile([self.lm.perplexity(t) for t in held], percentile))
        self.stats.extra.update(order=order, percentile=percentile, cut=round(self.cut, 3),
                                reference_docs=len(ref), heldout_docs=len(held))

    def process(self, record: Record) -> Record | str:
        return record if self.lm.perplexity(record.text) <= self.cut else "high_perplexity"
