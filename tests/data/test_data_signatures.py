"""The vectorised signature path against plain definitions (issue 3): batched shingling
equals the per-character definition of a k-gram key, every signature row equals
min_x (a_i x + b_i) mod 2**32 over the text's distinct shingle keys whatever the
batching, and the 3-sd check's exact binomial interval. Issue 17's batched paths:
canonical text, fold-after-normalise, vectorised exact Jaccard of candidate pairs."""
from __future__ import annotations

import math
import random
import sys
import unicodedata

import numpy as np
import pytest
from scipy.stats import binom

from tinystack.data.dedup.minhash import _CHUNK, EMPTY, MinHasher, MinHashParams, estimate_interval
from tinystack.data.dedup.near_duplicates import pair_jaccard
from tinystack.data.dedup.shingles import (
    canonical,
    canonical_batch,
    exact_jaccard,
    fold_canonical,
    mix64,
    shingle_hashes,
    shingle_hashes_batch,
    shingle_set,
)

TEXTS = ["", "   ", "a", "ab", "abc", "Hello,   World!\n\tagain", "中", "中文", "机器学习是人工智能的一个分支。",
         "ＡＢＣ　ｄｅｆ，全角", "x", "e\u0301 café ﬁ", "word " * 7, "😀🙂 emoji and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]


def reference_keys(text: str, k: int, casefold: bool = True) -> np.ndarray:
    """The contract of char shingling, one k-gram at a time in Python integers."""
    c = [ord(ch) for ch in canonical(text, casefold)]
    if not c:
        return np.zeros(0, dtype=np.uint64)
    grams = [c[i : i + k] for i in range(len(c) - k + 1)] or [c]
    keys = [sum(v << (21 * (len(g) - 1 - j)) for j, v in enumerate(g)) % (1 << 64) for g in grams]
    return mix64(np.array(keys, dtype=np.uint64))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_batched_char_shingles_equal_the_definition(k):
    rng = random.Random(k)
    texts = TEXTS + [t[: rng.randrange(0, 6)] for t in TEXTS] + ["".join(rng.choice("ab 中") for _ in range(50))]
    rng.shuffle(texts)
    hashes, counts = shingle_hashes_batch(texts, k)
    ends = np.cumsum(counts)
    for t, e, n in zip(texts, ends, counts):
        assert np.array_equal(hashes[e - n : e], reference_keys(t, k)), (t, k)
    assert np.array_equal(shingle_hashes(texts[3], k), reference_keys(texts[3], k))


def test_batched_word_shingles_equal_per_text():
    texts = ["the cat sat on the mat", "", "one", "two words", "a b c d e f g"]
    hashes, counts = shingle_hashes_batch(texts, 2, unit="word")
    assert counts.tolist() == [5, 0, 1, 1, 6]
    parts = [shingle_hashes_batch([t], 2, unit="word")[0] for t in texts]
    assert np.array_equal(hashes, np.concatenate(parts))


def reference_signature(hasher: MinHasher, text: str) -> np.ndarray:
    """min over distinct keys x of (a_i x + b_i) mod 2**32, in exact integer arithmetic."""
    x = np.unique((reference_keys(text, hasher.params.k) >> np.uint64(32)).astype(np.uint64))
    if len(x) == 0:
        return np.full(hasher.params.num_perm, EMPTY, dtype=np.uint32)
    a, b = hasher.a.astype(np.uint64), hasher.b.astype(np.uint64)  # (P, 1)
    return ((a * x[None, :] + b) & np.uint64(0xFFFFFFFF)).min(axis=1).astype(np.uint32)


def test_signatures_equal_the_definition_whatever_the_batching():
    rng = random.Random(0)
    long_text = "".join(chr(0x4E00 + rng.randrange(3000)) for _ in range(3 * _CHUNK))  # > one tile
    texts = TEXTS + [long_text] + [" ".join(rng.choice(["alpha", "beta", "gamma"])
                                            for _ in range(rng.randrange(1, 400))) for _ in range(40)]
    hasher = MinHasher(MinHashParams(num_perm=40, seed=3))  # not a multiple of the tile's block
    want = np.stack([reference_signature(hasher, t) for t in texts])
    assert np.array_equal(hasher.signatures(texts), want)
    order = rng.sample(range(len(texts)), len(texts))
    assert np.array_equal(hasher.signatures([texts[i] for i in order]), want[order])
    assert np.array_equal(hasher.signatures_from_shingles([hasher.shingles(t) for t in texts]), want)
    assert (want[texts.index("")] == EMPTY).all()


def test_estimate_interval_is_the_binomial_central_interval():
    j = np.concatenate([[0.0, 1e-6, 0.01, 0.5, 0.85, 0.999, 1.0], np.random.default_rng(0).random(200)])
    mass = math.erf(3 / math.sqrt(2))
    lo, hi = estimate_interval(j, 128)
    assert np.array_equal(lo * 128, binom.ppf((1 - mass) / 2, 128, j))
    assert np.array_equal(hi * 128, binom.ppf((1 + mass) / 2, 128, j))
    cover = binom.cdf(hi * 128, 128, j) - binom.cdf(lo * 128 - 1, 128, j)
    assert (cover >= mass - 1e-12).all()
    # where the normal approximation holds, it is the familiar J +- 3 sd, up to one count
    sd = np.sqrt(0.5 * 0.5 / 128)
    lo5, hi5 = estimate_interval(0.5, 128)
    assert abs(lo5[0] - (0.5 - 3 * sd)) <= 1 / 128 and abs(hi5[0] - (0.5 + 3 * sd)) <= 1 / 128


def test_estimates_follow_the_binomial_across_the_jaccard_range():
    """Pairs spanning J in (0, 1): >= 99 % inside the exact 3-sd interval, and the
    squared standardised error averages ~1 (estimates neither too tight nor too loose)."""
    rng = random.Random(5)
    words = [f"w{i}" for i in range(400)]
    hasher = MinHasher()
    jx, est = [], []
    for _ in range(300):
        a = " ".join(rng.choice(words) for _ in range(300))
        chars = list(a)
        for _ in range(int(250 * (1 / max(rng.random(), 0.02) - 1))):
            chars[rng.randrange(len(chars))] = rng.choice("xyz0123456789")
        b = "".join(chars)
        jx.append(exact_jaccard(shingle_set(a), shingle_set(b)))
        sa, sb = hasher.signatures([a, b])
        est.append(float((sa == sb).mean()))
    jx, est = np.array(jx), np.array(est)
    assert jx.min() < 0.15 and jx.max() > 0.9  # the range is really covered
    lo, hi = estimate_interval(jx, 128)
    assert ((est >= lo) & (est <= hi)).mean() >= 0.99
    sd = np.sqrt(jx * (1 - jx) / 128)
    ok = sd > 0
    assert 0.7 < (((est - jx)[ok] / sd[ok]) ** 2).mean() < 1.4


def plain_canonical(text: str, casefold: bool) -> str:
    """The definition: NFKC, case folding, whitespace runs -> one space."""
    text = unicodedata.normalize("NFKC", text)
    return " ".join((text.casefold() if casefold else text).split())


def test_batched_canonical_equals_the_definition():
    rng = random.Random(2)
    pool = "ＡＢｚ０９，。！　\u3000 \t\n\u2028ﬁ①㎏e\u0301Å中文ΣΑΣßẞİ😀𝔘" + "abc DEF"
    texts = TEXTS + ["".join(rng.choice(pool) for _ in range(rng.randrange(0, 60))) for _ in range(300)]
    for cf in (True, False):
        assert canonical_batch(texts, cf) == [plain_canonical(t, cf) for t in texts]
        assert [canonical(t, cf) for t in texts] == [plain_canonical(t, cf) for t in texts]


def test_folding_the_cased_canonical_text_equals_the_folded_one():
    """The dedup step normalises once and folds after (`fold_canonical`): equal to normalising
    the folded text for every code point (folding never touches whitespace)."""
    cps = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000]
    rng = random.Random(4)
    chunks = ["".join(cps[i : i + 2000]) for i in range(0, len(cps), 2000)]
    chunks += [" ".join(rng.sample(cps, 50)) for _ in range(50)]
    assert [fold_canonical(c) for c in canonical_batch(chunks, False)] == canonical_batch(chunks, True)


def test_vectorised_pair_jaccard_equals_exact_jaccard():
    rng = np.random.default_rng(6)
    sets = [np.unique(rng.integers(0, 300, size=rng.integers(0, 120))).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            for _ in range(60)]
    sets = [np.sort(s) for s in sets] + [np.zeros(0, np.uint64)]
    # two values equal in their top 52 bits: their keys collide, so that group is counted pair by pair
    near = np.array([5 << 12, (5 << 12) | 1, 7 << 40], dtype=np.uint64)
    sets += [near, near[[1, 2]]]
    values, sizes = np.concatenate(sets), np.array([len(s) for s in sets])
    pairs = rng.integers(0, len(sets), size=(500, 2))
    empty, n1, n2 = len(sets) - 3, len(sets) - 2, len(sets) - 1
    pairs = np.concatenate([pairs, [[empty, empty], [n1, n2], [n2, n1], [n1, n1]]])
    want = [exact_jaccard(sets[i], sets[j]) for i, j in pairs.tolist()]
    assert pair_jaccard(values, sizes, pairs[:, 0], pairs[:, 1]).tolist() == want
    alone = pair_jaccard(values, sizes, pairs[:-2, 0], pairs[:-2, 1])  # no colliding b-set: the vectorised path
    assert alone.tolist() == want[:-2]
    assert 0 < np.mean(np.array(want) > 0) < 1  # some overlapping and some disjoint pairs
