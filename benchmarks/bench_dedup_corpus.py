"""Shared by the dedup benchmarks: the planted near-duplicate corpora (English, Chinese),
exact all-pairs Jaccard ground truth, and "ladder" pairs that span the whole Jaccard range.

Documents are ~2,000 characters. English: the standard library's docstrings,
concatenated. Chinese: text sampled from a Zipf distribution over 3,000 common CJK
characters, in 1-4 character words with full-width punctuation. Near duplicates are
made by random character edits (replace / insert / delete) and occasional span moves.
"""
from __future__ import annotations

import random

import numpy as np

DOC_CHARS = 2000
EN_ALPHABET = "abcdefghijklmnopqrstuvwxyz     "
ZH_ALPHABET = "".join(chr(0x4E00 + i * 7) for i in range(300))


def english_bases(n: int) -> list[str]:
    from tinystack.data.io.corpus import iter_corpus

    texts, cur = [], ""
    for r in iter_corpus():
        cur = f"{cur}\n\n{r.text}" if cur else r.text
        if len(cur) >= DOC_CHARS:
            texts.append(cur[:DOC_CHARS])
            cur = ""
            if len(texts) == n:
                break
    return texts


def chinese_bases(n: int, rng: random.Random) -> list[str]:
    chars = [chr(0x4E00 + i * 7) for i in range(3000)]
    weights = 1.0 / np.arange(1, len(chars) + 1)
    nprng = np.random.default_rng(rng.randrange(1 << 30))
    out = []
    for _ in range(n):
        idx = nprng.choice(len(chars), size=DOC_CHARS, p=weights / weights.sum())
        s, i = [], 0
        while i < len(idx):
            w = rng.randint(1, 4)
            s.append("".join(chars[j] for j in idx[i : i + w]))
            i += w
            if rng.random() < 0.15:
                s.append(rng.choice("，。、；"))
        out.append("".join(s)[:DOC_CHARS])
    return out


def mutate(text: str, n_edits: int, rng: random.Random, alphabet: str) -> str:
    chars = list(text)
    for _ in range(n_edits):
        op = rng.random()
        pos = rng.randrange(len(chars))
        if op < 0.4:
            chars[pos] = rng.choice(alphabet)
        elif op < 0.7:
            chars.insert(pos, rng.choice(alphabet))
        elif len(chars) > 10:
            del chars[pos]
    if rng.random() < 0.2 and len(chars) > 100:  # occasionally move a whole span (word-level edit)
        a = rng.randrange(len(chars) - 50)
        span = chars[a : a + 40]
        del chars[a : a + 40]
        b = rng.randrange(len(chars))
        chars[b:b] = span
    return "".join(chars)


def planted(bases: list[str], rng: random.Random, alphabet: str) -> list[str]:
    """Bases plus variants (0-150 edits: Jaccard spreads across 0.85), some of variants."""
    docs = list(bases)
    for b in bases:
        if rng.random() < 0.5:
            v = mutate(b, rng.randrange(0, 150), rng, alphabet)
            docs.append(v)
            if rng.random() < 0.3:  # a variant of the variant
                docs.append(mutate(v, rng.randrange(0, 60), rng, alphabet))
    rng.shuffle(docs)
    return docs


def ladder_pairs(bases: list[str], n: int, rng: random.Random, alphabet: str) -> list[tuple[str, str]]:
    """n pairs (base, edited copy) whose Jaccard covers (0, 1] about evenly, to fill every
    bin of the estimate check (the planted corpus has almost no Chinese pairs between
    0.02 and 0.6: unrelated texts share few 3-grams). A ~2,000-character text keeps
    J ~ 1 / (1 + edits / 250), so a target t ~ U(0, 1) becomes 250 (1/t - 1) edits."""
    out = []
    for _ in range(n):
        base = rng.choice(bases)
        target = max(rng.random(), 1e-3)
        edits = min(4000, round(250 * (1 / target - 1)))
        out.append((base, mutate(base, edits, rng, alphabet)))
    return out


def all_pairs_jaccard(sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, J) of every pair i < j sharing a shingle (sparse doc x shingle product);
    every pair not listed has J = 0."""
    from scipy import sparse

    vocab, inv = np.unique(np.concatenate(sets), return_inverse=True)
    lens = np.array([len(s) for s in sets])
    rows = np.repeat(np.arange(len(sets)), lens)
    m = sparse.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, inv)), shape=(len(sets), len(vocab)))
    inter = sparse.triu(m @ m.T, k=1).tocoo()
    i, j, v = inter.row.astype(np.int64), inter.col.astype(np.int64), inter.data.astype(np.float64)
    return i, j, v / (lens[i] + lens[j] - v)
