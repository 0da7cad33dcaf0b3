"""Near-dup accuracy, signature throughput vs datasketch, and estimate-vs-exact Jaccard.

    .venv/bin/python benchmarks/bench_dedup.py [--bases 1500] [--ds-docs 600]

Builds a planted benchmark per language: `bases` documents of ~2,000 characters
(English: the standard library's docstrings, concatenated; Chinese: text sampled from
a Zipf distribution over 3,000 common CJK characters, in 1-4 character words with
punctuation), plus near-duplicate variants made by random character and word edits
(0-150 edits, so true Jaccard spreads across the threshold; some variants are made
from variants, so clusters can be transitive). Ground truth: the exact Jaccard of
the 3-gram sets of *every* pair (sparse doc x shingle product), threshold 0.85.

Reports, per language:
* recall / precision of `neardup.find_pairs` (exact verification, the default), of
  estimate-only verification, and of datasketch MinHashLSH (banding alone) for scale;
* signatures per second, ours (`MinHasher.signatures`) vs datasketch `MinHash.bulk`
  (128 permutations, default sha1 hash), both from raw text, interleaved, best of 3;
* share of sampled pairs whose estimate is within 3 sd = 3 sqrt(J(1-J)/128) of exact
  (sample: every pair with exact J >= 0.3 plus as many random pairs; headline over
  pairs where the normal approximation behind "3 sd" holds, 128 J (1-J) >= 5, and
  also over all sampled pairs).
Writes benchmarks/results/dedup.json and dedup.png.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

from tinystack.atomic import write_json
from tinystack.data.minhash import MinHasher
from tinystack.data.neardup import NearDupParams, find_pairs
from tinystack.data.shingles import canonical, shingle_set

RESULTS = Path(__file__).parent / "results"
DOC_CHARS = 2000


def english_bases(n: int) -> list[str]:
    from tinystack.data.corpus import iter_corpus

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
    if rng.random() < 0.2:  # occasionally move a whole span (word-level edit)
        a = rng.randrange(len(chars) - 50)
        span = chars[a : a + 40]
        del chars[a : a + 40]
        b = rng.randrange(len(chars))
        chars[b:b] = span
    return "".join(chars)


def planted(bases: list[str], rng: random.Random, alphabet: str) -> list[str]:
    docs = list(bases)
    for b in bases:
        if rng.random() < 0.5:
            v = mutate(b, rng.randrange(0, 150), rng, alphabet)
            docs.append(v)
            if rng.random() < 0.3:  # a variant of the variant
                docs.append(mutate(v, rng.randrange(0, 60), rng, alphabet))
    rng.shuffle(docs)
    return docs


def all_pairs_jaccard(sets: list[np.ndarray], min_j: float) -> dict[tuple[int, int], float]:
    """Exact Jaccard of every pair with J >= min_j (sparse doc x shingle product)."""
    from scipy import sparse

    vocab, inv = np.unique(np.concatenate(sets), return_inverse=True)
    lens = np.array([len(s) for s in sets])
    rows = np.repeat(np.arange(len(sets)), lens)
    m = sparse.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, inv)), shape=(len(sets), len(vocab)))
    inter = (m @ m.T).tocoo()
    i, j, v = inter.row, inter.col, inter.data
    keep = i < j
    i, j, v = i[keep], j[keep], v[keep]
    jac = v / (lens[i] + lens[j] - v)
    sel = jac >= min_j
    return {(int(a), int(b)): float(x) for a, b, x in zip(i[sel], j[sel], jac[sel])}


def pr(found: set, truth: set) -> tuple[float, float]:
    tp = len(found & truth)
    return (tp / len(truth) if truth else 1.0), (tp / len(found) if found else 1.0)


def throughput(docs: list[str], ds_docs: int) -> dict:
    from datasketch import MinHash

    hasher = MinHasher()
    sub = docs[:ds_docs]

    def ours() -> float:
        t = time.perf_counter()
        hasher.signatures(docs)
        return len(docs) / (time.perf_counter() - t)

    def theirs() -> float:
        t = time.perf_counter()
        shingles = []
        for d in sub:
            c = canonical(d)
            shingles.append([c[k : k + 3].encode("utf-8") for k in range(len(c) - 2)])
        MinHash.bulk(shingles, num_perm=128)
        return len(sub) / (time.perf_counter() - t)

    o, d = [], []
    for _ in range(3):  # interleaved, so background load hits both alike
        o.append(ours())
        d.append(theirs())
    return {"ours_docs_per_s": round(max(o), 1), "datasketch_docs_per_s": round(max(d), 1),
            "speedup": round(max(o) / max(d), 2), "ours_runs": [round(x, 1) for x in o],
            "datasketch_runs": [round(x, 1) for x in d]}


def run_language(name: str, docs: list[str], ds_docs: int, rng: random.Random) -> dict:
    from datasketch import MinHash, MinHashLSH

    t0 = time.perf_counter()
    sets = [shingle_set(d) for d in docs]
    exact = all_pairs_jaccard(sets, 0.3)
    truth = {p for p, j in exact.items() if j >= 0.85}
    t_truth = time.perf_counter() - t0

    sigs = MinHasher().signatures(docs)
    texts_of = lambda ix: {int(i): docs[i] for i in ix}
    t0 = time.perf_counter()
    pairs, _ = find_pairs(sigs, NearDupParams(), texts_of)
    t_find = time.perf_counter() - t0
    found = set(map(tuple, pairs.tolist()))
    pairs_e, _ = find_pairs(sigs, NearDupParams(verify="estimate"))
    found_e = set(map(tuple, pairs_e.tolist()))

    lsh = MinHashLSH(threshold=0.85, num_perm=128)
    hs = []
    for i, s in enumerate(sigs):
        m = MinHash(num_perm=128, hashvalues=s.astype(np.uint64), scheme="legacy")
        hs.append(m)
        lsh.insert(i, m)
    found_ds = {(min(i, j), max(i, j)) for i, m in enumerate(hs) for j in lsh.query(m) if j != i}

    # estimate vs exact: all pairs with J >= 0.3 plus as many random pairs
    sample = list(exact.items())
    n = len(docs)
    for _ in range(len(sample)):
        i, j = sorted(rng.sample(range(n), 2))
        if (i, j) not in exact:
            inter = len(np.intersect1d(sets[i], sets[j], assume_unique=True))
            sample.append(((i, j), inter / (len(sets[i]) + len(sets[j]) - inter)))
    ij = np.array([p for p, _ in sample])
    jx = np.array([j for _, j in sample])
    est = (sigs[ij[:, 0]] == sigs[ij[:, 1]]).mean(axis=1)
    sd = np.sqrt(jx * (1 - jx) / 128)
    ok = np.abs(est - jx) <= 3 * sd + 1e-12
    # The 3-sd band is a normal approximation of Binomial(128, J); it holds when
    # 128 J (1 - J) is not tiny. For unrelated pairs (J ~ 0.01 in Chinese) the count
    # of equal positions is Poisson-like and "3 sd" is ~1.5 positions, so both
    # figures are reported: all sampled pairs, and pairs with 128 J (1 - J) >= 5.
    normal = 128 * jx * (1 - jx) >= 5
    within = float(np.mean(ok[normal])) if normal.any() else float("nan")
    within_all = float(np.mean(ok))

    r, p = pr(found, truth)
    re_, pe = pr(found_e, truth)
    rd, pd = pr(found_ds, truth)
    out = {
        "docs": n, "true_pairs": len(truth), "recall": round(r, 4), "precision": round(p, 4),
        "estimate_only": {"recall": round(re_, 4), "precision": round(pe, 4)},
        "datasketch_lsh_unverified": {"recall": round(rd, 4), "precision": round(pd, 4)},
        "find_pairs_s": round(t_find, 2), "ground_truth_s": round(t_truth, 1),
        "estimate_within_3sd": round(within, 4), "estimate_pairs_normal_range": int(normal.sum()),
        "estimate_within_3sd_all_pairs": round(within_all, 4), "estimate_pairs_sampled": len(sample),
        "throughput": throughput(docs, ds_docs),
    }
    out["_scatter"] = (jx.tolist(), est.tolist())
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results) + 1, figsize=(5 * (len(results) + 1), 4.2))
    for ax, (lang, r) in zip(axes, results.items()):
        jx, est = map(np.asarray, r["_scatter"])
        ax.scatter(jx, est, s=3, alpha=0.4)
        g = np.linspace(0, 1, 200)
        sd = np.sqrt(g * (1 - g) / 128)
        ax.plot(g, g + 3 * sd, "r--", lw=1)
        ax.plot(g, g - 3 * sd, "r--", lw=1, label="±3 sd")
        ax.axvline(0.85, color="gray", lw=0.8)
        ax.set(title=f"{lang}: estimate vs exact ({r['estimate_within_3sd']:.1%} within 3 sd)",
               xlabel="exact Jaccard (3-grams)", ylabel="MinHash estimate (128)")
        ax.legend()
    ax = axes[-1]
    names = list(results)
    x = np.arange(len(names))
    ax.bar(x - 0.2, [results[k]["throughput"]["ours_docs_per_s"] for k in names], 0.4, label="tinystack")
    ax.bar(x + 0.2, [results[k]["throughput"]["datasketch_docs_per_s"] for k in names], 0.4, label="datasketch bulk")
    ax.set_xticks(x, names)
    ax.set(title="signatures / s (single process)", ylabel="docs/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bases", type=int, default=1500)
    ap.add_argument("--ds-docs", type=int, default=600, help="documents timed for datasketch (it is slow)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    langs = {
        "english": planted(english_bases(args.bases), rng, "abcdefghijklmnopqrstuvwxyz     "),
        "chinese": planted(chinese_bases(args.bases, rng), rng, "".join(chr(0x4E00 + i * 7) for i in range(300))),
    }
    results = {}
    for name, docs in langs.items():
        r = run_language(name, docs, args.ds_docs, rng)
        results[name] = r
        t = r["throughput"]
        print(f"{name}: {r['docs']} docs, {r['true_pairs']} true pairs >= 0.85 | recall {r['recall']:.4f} "
              f"precision {r['precision']:.4f} (estimate-only {r['estimate_only']['recall']:.4f}/"
              f"{r['estimate_only']['precision']:.4f}; datasketch LSH unverified "
              f"{r['datasketch_lsh_unverified']['recall']:.4f}/{r['datasketch_lsh_unverified']['precision']:.4f}) | "
              f"signatures {t['ours_docs_per_s']:.0f} docs/s vs datasketch {t['datasketch_docs_per_s']:.0f} "
              f"= {t['speedup']:.1f}x | estimate within 3 sd: {r['estimate_within_3sd']:.2%} of "
              f"{r['estimate_pairs_normal_range']} pairs with 128J(1-J) >= 5 "
              f"({r['estimate_within_3sd_all_pairs']:.2%} of all {r['estimate_pairs_sampled']} sampled)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(results, RESULTS / "dedup.png")
    for r in results.values():
        r.pop("_scatter")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    write_json(RESULTS / "dedup.json", {"results": results, "params": vars(args), "load_avg_1m": load,
                                        "python": sys.version.split()[0], "cpus": os.cpu_count()})


if __name__ == "__main__":
    main()
