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


# --- short documents (bench_dedup_short.py) -------------------------------------------------------

SHORT_CHARS = 330  # mean length of a short document


def _short_lengths(n: int, rng: random.Random) -> list[int]:
    return [min(600, max(120, round(rng.gauss(SHORT_CHARS, 70)))) for _ in range(n)]


def english_short(n: int, rng: random.Random) -> list[str]:
    """Up to n English documents of ~330 characters: the built-in corpus (stdlib docstrings,
    ~2.1 M characters, so ~6,000 of them at most) cut into consecutive pieces at spaces."""
    from tinystack.data.io.corpus import iter_corpus

    lengths, out, cur = _short_lengths(n, rng), [], ""
    for r in iter_corpus():
        cur = f"{cur}\n\n{r.text}" if cur else r.text
        while len(out) < n and len(cur) >= lengths[len(out)]:
            cut = cur.rfind(" ", 0, lengths[len(out)])
            cut = cut if cut > 60 else lengths[len(out)]
            out.append(cur[:cut].strip())
            cur = cur[cut:].lstrip()
        if len(out) == n:
            break
    return out


def chinese_chars() -> str:
    """~500 common Chinese characters in frequency order, from charset_normalizer (installed
    with requests): a real frequency ranking, available offline on every machine here."""
    from charset_normalizer.constant import COMMON_CHINESE_CHARACTERS

    return COMMON_CHINESE_CHARACTERS


def chinese_short(n: int, rng: random.Random, english: list[str] | None = None) -> list[str]:
    """n synthesised Chinese documents of ~330 characters. Characters follow a Zipf law over
    their frequency rank and form a 6,000-word vocabulary (1-4 characters), documents draw
    words by a Zipf law over that vocabulary with full-width punctuation, so unrelated
    documents share common words (and 3-grams) as real text does. With `english`, every
    document mixes in English words (technical terms in Chinese prose)."""
    chars = chinese_chars()
    nprng = np.random.default_rng(rng.randrange(1 << 30))
    cw = 1.0 / np.arange(1, len(chars) + 1) ** 0.9
    sizes = nprng.choice([1, 2, 3, 4], size=6000, p=[0.3, 0.5, 0.12, 0.08])
    idx = nprng.choice(len(chars), size=int(sizes.sum()), p=cw / cw.sum())
    ends = np.cumsum(sizes)
    # The most frequent words are the most frequent single characters (的, 一, 是...), as in
    # real text; a Zipf-Mandelbrot law (rank + 3) keeps the top word near 5 % of tokens.
    vocab = list(chars[:40]) + ["".join(chars[j] for j in idx[e - s : e]) for e, s in zip(ends, sizes)]
    ww = 1.0 / (np.arange(1, len(vocab) + 1) + 3.0)
    ww /= ww.sum()
    en_words = " ".join(english or []).split()
    out = []
    for length in _short_lengths(n, rng):
        s: list[str] = []
        size = 0
        for w in nprng.choice(len(vocab), size=length, p=ww):  # more words than needed
            piece = vocab[w]
            if en_words and rng.random() < 0.08:
                piece = f" {rng.choice(en_words)} "
            s.append(piece)
            size += len(piece)
            r = rng.random()
            if r < 0.08:
                s.append("，")
            elif r < 0.11:
                s.append("。")
            if size >= length:
                break
        out.append("".join(s).strip()[:length])
    return out


def short_variant(text: str, target: float, rng: random.Random, alphabet: str) -> str:
    """An edited copy of a short text aiming at Jaccard `target` over its 3-gram set: a
    character edit changes up to 3 of the text's ~len 3-grams on each side, so
    J ~ (n - 3e) / (n + 3e), i.e. e = n (1 - t) / (3 (1 + t)) edits."""
    edits = round(len(text) * (1 - target) / (3 * (1 + target)))
    return mutate(text, edits, rng, alphabet) if edits else text


def reformatted(text: str, rng: random.Random) -> str:
    """The same content laid out differently: doubled spaces, a line break, other case;
    canonically equal under the near-dup key (Jaccard 1), not byte-equal."""
    words = text.split(" ")
    i = rng.randrange(len(words))
    words[i] = words[i] + (" " if rng.random() < 0.5 else "\n")
    out = " ".join(words)
    return out.upper() if out.isascii() and rng.random() < 0.5 else out + "  "


def short_corpus(n_docs: int, rng: random.Random, dup_share: float = 0.2) -> tuple[list[str], list[str]]:
    """(texts, language of each) for `n_docs` short documents: English (stdlib docstrings),
    Chinese (synthesised), mixed Chinese with English words, in shuffled order; a share
    `dup_share` of the documents are planted copies of others: byte-exact copies,
    reformatted copies (J = 1) and edited copies whose target Jaccard is uniform in
    [0.6, 1.0] (so the threshold 0.85 falls in the middle), a fifth of them copies of copies."""
    n_dup = round(n_docs * dup_share)
    n_base = n_docs - n_dup
    en = english_short(round(n_base * 0.4), rng)
    n_mix = round(n_base * 0.1)
    zh = chinese_short(n_base - len(en) - n_mix, rng)
    mix = chinese_short(n_mix, rng, english=en[:500])
    docs = [(t, "en") for t in en] + [(t, "zh") for t in zh] + [(t, "mixed") for t in mix]
    zh_alpha = chinese_chars()
    for _ in range(n_dup):
        text, lang = docs[rng.randrange(len(docs))]  # copies of copies too
        kind = rng.random()
        if kind < 0.1:
            new = text
        elif kind < 0.2:
            new = reformatted(text, rng)
        else:
            new = short_variant(text, rng.uniform(0.6, 1.0), rng, EN_ALPHABET if lang == "en" else zh_alpha)
        docs.append((new, lang))
    rng.shuffle(docs)
    return [t for t, _ in docs], [lang for _, lang in docs]


def similar_pairs(sets: list[np.ndarray], threshold: float, ell: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i < j) of sorted-unique shingle arrays with exact Jaccard >= threshold, and
    that Jaccard: (pairs (m, 2), jaccard (m,)). Exact, by prefix filtering with the l-prefix
    scheme (AllPairs; AdaptJoin, Wang et al. 2012): order shingles rarest first; a pair
    with J >= t shares o >= a_X = ceil(t |X|) shingles for X = A and B, so its first `ell`
    shared shingles lie within the first |X| - a_X + ell shingles of each side (after the
    ell-th come the o - ell others). Candidates are the pairs sharing >= ell prefix shingles
    (a sparse product of the prefix matrix counts them), then each candidate's Jaccard is
    computed exactly. Far cheaper than the all-pairs product on short English texts, where
    unrelated documents share most of their common 3-grams."""
    from scipy import sparse

    n = len(sets)
    lens = np.array([len(s) for s in sets], dtype=np.int64)
    _, inv = np.unique(np.concatenate(sets), return_inverse=True)
    df = np.bincount(inv)
    rank = np.empty(len(df), dtype=np.int64)
    rank[np.lexsort((np.arange(len(df)), df))] = np.arange(len(df))  # rarest first
    doc = np.repeat(np.arange(n), lens)
    tok = rank[inv]
    order = np.lexsort((tok, doc))
    doc, tok = doc[order], tok[order]
    pos = np.arange(len(doc)) - np.repeat(np.cumsum(lens) - lens, lens)
    need = np.ceil(threshold * lens - 1e-9).astype(np.int64)  # rounded to the safe side
    prefix = lens - need + ell
    keep = pos < np.repeat(prefix, lens)
    shape = (n, len(df))
    pm = sparse.csr_matrix((np.ones(int(keep.sum()), np.float32), (doc[keep], tok[keep])), shape=shape)
    shared = sparse.triu(pm @ pm.T, k=1).tocoo()
    # a set smaller than ell has every shingle in its prefix: it needs min(ell, sizes) shared
    enough = shared.data >= np.minimum(ell, np.minimum(lens[shared.row], lens[shared.col]))
    i, j = shared.row[enough].astype(np.int64), shared.col[enough].astype(np.int64)
    full = sparse.csr_matrix((np.ones(len(doc), np.float32), (doc, tok)), shape=shape)
    inter = np.zeros(len(i))
    step = 1 << 16
    for s in range(0, len(i), step):
        a, b = full[i[s : s + step]], full[j[s : s + step]]
        inter[s : s + step] = np.asarray(a.multiply(b).sum(axis=1)).ravel()
    jac = inter / (lens[i] + lens[j] - inter)
    ok = jac >= threshold
    return np.stack([i[ok], j[ok]], axis=1), jac[ok]
