"""Shingling: a document -> the integer hashes of its k-shingles, as one NumPy array.

Near dedup compares *sets of shingles*. Two kinds:

* ``unit="char"`` (default, k=3): overlapping character k-grams of the canonical text.
  Works for CJK text, which has no spaces to split words on, with no segmenter.
* ``unit="word"``: overlapping k-grams of whitespace-separated tokens.

The canonical text (`canonical`) is NFKC, optionally case-folded, with every run of
whitespace collapsed to one space: formatting differences are not content differences.
`canonical_batch` computes it for many texts at once (the per-call cost matters on
short documents), and `fold_canonical` case-folds a case-kept canonical text, so a
caller that needs both forms (the dedup step: exact key and shingles) normalises once.

Vectorised, no Python loop per shingle: the text becomes an array of code points
(UTF-32 view, one element per character), and a k-gram's key is the polynomial
``sum(c[i+j] * B**(k-1-j)) mod 2**64`` computed for all positions at once with k
shifted array slices. For k <= 3 and code points < 2**21 (all of Unicode) the key is
an exact bit-packing, so distinct k-grams never collide. Keys then pass through the
splitmix64 finaliser so every output bit depends on every input bit; the permutation
step in `minhash.py` relies on that. No `hash()` anywhere, so the values are the same
in every process and on every machine.
"""
from __future__ import annotations

import hashlib
import unicodedata
from typing import Literal, Sequence

import numpy as np

Unit = Literal["char", "word"]
_BASE = np.uint64(1 << 21)  # > max code point: exact packing for k <= 3
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_SET_GROUP_CHARS = 1 << 16  # characters shingled at once by `shingle_sets_batch`


# Full-width ASCII forms (U+FF01..FF5E) and the ideographic space are the compatibility
# characters of everyday CJK text; mapping them first usually makes the full NFKC
# call unnecessary (`is_normalized` is far cheaper than `normalize`). The result is
# identical to plain NFKC: these are exactly NFKC's mappings for them.
def _map_fullwidth(texts: list[str]) -> list[str]:
    """U+FF01..FF5E -> U+0021..007E and U+3000 -> space in every text, as array arithmetic
    over their concatenation (`str.translate` with a dict costs a dict look-up per character,
    and one NumPy pass per short text a call's fixed cost). The mapping keeps each code point one
    code point, so the texts are cut back out of the result by their lengths."""
    c = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32).copy()
    wide = (c >= 0xFF01) & (c <= 0xFF5E)
    c[wide] -= 0xFEE0
    c[c == 0x3000] = 0x20
    joined = c.tobytes().decode("utf-32-le")
    out, at = [], 0
    for t in texts:
        out.append(joined[at : at + len(t)])
        at += len(t)
    return out


def canonical_batch(texts: Sequence[str], casefold: bool = True) -> list[str]:
    """`canonical` of every text; the compatibility mapping runs once over all the texts
    that need it, which is what makes many short CJK documents cheap."""
    out = list(texts)
    wide = [i for i, t in enumerate(out) if not t.isascii() and not unicodedata.is_normalized("NFKC", t)]
    if wide:
        for i, t in zip(wide, _map_fullwidth([out[i] for i in wide])):
            out[i] = t if unicodedata.is_normalized("NFKC", t) else unicodedata.normalize("NFKC", t)
    if casefold:
        return [" ".join((t.lower() if t.isascii() else t.casefold()).split()) for t in out]
    return [" ".join(t.split()) for t in out]  # str.split() splits on Unicode whitespace, in C


def canonical(text: str, casefold: bool = True) -> str:
    """NFKC, optional case folding, whitespace runs -> one space, stripped."""
    return canonical_batch([text], casefold)[0]


def fold_canonical(text: str) -> str:
    """`canonical(t, True)` from `canonical(t, False)`, without a second NFKC pass: case
    folding maps each character on its own and never creates, removes or changes
    whitespace (checked over every code point by the tests), so folding commutes with
    the whitespace collapse; ASCII text is lowered (the same, faster)."""
    return text.lower() if text.isascii() else text.casefold()


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over a uint64 array (a bijection with full avalanche)."""
    return _mix64_inplace(np.array(x, dtype=np.uint64))


def _mix64_inplace(x: np.ndarray) -> np.ndarray:
    """`mix64` overwriting the uint64 array `x`: one temporary instead of eight fresh
    arrays (fresh large arrays cost page faults, which dominate at this size)."""
    t = x >> np.uint64(30)
    x ^= t
    x *= _M1
    np.right_shift(x, np.uint64(27), out=t)
    x ^= t
    x *= _M2
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def _kgram_keys(codes: np.ndarray, k: int) -> np.ndarray:
    """Polynomial key of every k-gram of a uint64 array (wrapping mod 2**64)."""
    n = len(codes) - k + 1
    if n <= 0:  # shorter than one shingle: the whole sequence is the only shingle
        n, k = 1, len(codes)
    key = codes[:n] * _BASE if k > 1 else codes[:n].astype(np.uint64)  # uint32 * uint64 -> uint64
    for j in range(1, k):  # k array operations, not n*k Python steps
        key += codes[j : j + n]
        if j < k - 1:
            key *= _BASE
    return key


def _word_codes(text: str) -> np.ndarray:
    """One uint64 per whitespace token (8-byte BLAKE2b: stable, unlike `hash()`).

    Words are far fewer than characters, so one digest per word is cheap; the
    per-shingle work after this is array arithmetic like the char path.
    """
    words = text.split(" ")
    digests = b"".join(hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest() for w in words)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _char_keys_batch(texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """k-gram keys of several canonical texts at once: one encode and k array
    operations over their concatenation, then the k-grams that straddle two texts
    are dropped. Same keys, in the same order, as `_kgram_keys` text by text."""
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))  # code points
    counts = np.where(lens >= k, lens - k + 1, np.minimum(lens, 1))
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)  # widened by _kgram_keys
    if len(codes) < k or (lens >= k).sum() == 0:
        keys = [_kgram_keys(codes[s - n : s], k) for s, n in zip(np.cumsum(lens), lens) if n]
        return (np.concatenate(keys) if keys else np.zeros(0, np.uint64)), counts
    keys = _kgram_keys(codes, k)  # len(codes) - k + 1 windows
    ends = np.cumsum(lens)
    valid = np.ones(len(keys), dtype=bool)
    for j in range(1, k):  # a window starting at end - j spans a text boundary
        e = ends - j
        valid[e[(e >= 0) & (e < len(keys))]] = False
    keys = keys[valid]
    short = np.flatnonzero((lens < k) & (lens > 0))
    if len(short):  # texts shorter than k: one shingle each, the whole text
        at = (np.cumsum(counts) - counts)[short]
        keys = np.insert(keys, at - np.arange(len(short)),
                         [_kgram_keys(codes[ends[i] - lens[i] : ends[i]], k)[0] for i in short])
    return keys, counts


def shingle_hashes_batch(texts: list[str], k: int = 3, unit: Unit = "char",
                         casefold: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """`shingle_hashes` of several texts: (all hashes concatenated, count per text).

    Text i's hashes are ``out[offsets[i]:offsets[i + 1]]`` with offsets the cumulative
    counts. For the char unit the texts share one encode and one pass of array
    operations, which is what makes short documents cheap (a NumPy call has a fixed
    cost whatever its size).
    """
    return canonical_shingle_hashes(canonical_batch(texts, casefold), k, unit)


def canonical_shingle_hashes(canon: list[str], k: int = 3, unit: Unit = "char") -> tuple[np.ndarray, np.ndarray]:
    """`shingle_hashes_batch` of texts that are already canonical (`canonical_batch`)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if unit == "char":
        keys, counts = _char_keys_batch(canon, k)
    elif unit == "word":
        parts = [_kgram_keys(_word_codes(t), k) if t else np.zeros(0, np.uint64) for t in canon]
        counts = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        keys = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    else:
        raise ValueError(f"unit must be 'char' or 'word', got {unit!r}")
    return _mix64_inplace(keys), counts


def shingle_hashes(text: str, k: int = 3, unit: Unit = "char", casefold: bool = True) -> np.ndarray:
    """uint64 hashes of the k-shingles of `canonical(text)` (with repeats; min ignores them).

    An empty canonical text gives an empty array. A text shorter than k gives one
    shingle (the whole text), so short documents still get a signature.
    """
    return shingle_hashes_batch([text], k, unit, casefold)[0]


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort + neighbour mask: far faster than `np.unique` here)."""
    x = np.sort(x)
    if len(x) > 1:
        x = x[np.concatenate(([True], x[1:] != x[:-1]))]
    return x


def shingle_sets_batch(texts: list[str], k: int = 3, unit: Unit = "char",
                       casefold: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """`shingle_set` of several texts: (their sets concatenated, size of each). Shingling
    is batched over groups of ~`_SET_GROUP_CHARS` characters (bounding the temporaries);
    each set is then sorted on its own: a few hundred values sort in cache, far faster
    a value than one sort of all of them."""
    sets: list[np.ndarray] = []
    start = 0
    while start < len(texts):
        stop, chars = start, 0
        while stop < len(texts) and (stop == start or chars + len(texts[stop]) <= _SET_GROUP_CHARS):
            chars += len(texts[stop])
            stop += 1
        h, counts = shingle_hashes_batch(texts[start:stop], k, unit, casefold)
        sets += [sorted_unique(h[e - c : e]) for e, c in zip(np.cumsum(counts).tolist(), counts.tolist())]
        start = stop
    sizes = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    return (np.concatenate(sets) if sets else np.zeros(0, np.uint64)), sizes


def shingle_set(text: str, k: int = 3, unit: Unit = "char", casefold: bool = True) -> np.ndarray:
    """The sorted distinct shingle hashes (the set whose Jaccard MinHash estimates)."""
    return sorted_unique(shingle_hashes(text, k, unit, casefold))


def exact_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard of two sorted-unique shingle arrays (as from `shingle_set`)."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
