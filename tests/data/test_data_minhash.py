"""MinHash signatures, LSH banding, verification and clusters (issue 3)."""
from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
from datasketch import MinHashLSH

from tinystack.data.dedup import near_duplicates as nd
from tinystack.data.dedup.index import NearDupIndex
from tinystack.data.dedup.lsh import candidate_probability, optimal_bands
from tinystack.data.dedup.minhash import MinHasher, MinHashParams, estimate_jaccard, jaccard_std
from tinystack.data.dedup.near_duplicates import NearDupParams, find_pairs
from tinystack.data.dedup.near_step import NearDedup
from tinystack.data.dedup.shingles import exact_jaccard, shingle_set
from tinystack.data.io.records import Record

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def doc(rng: random.Random, n_words: int = 120) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(n_words))


def edit(rng: random.Random, text: str, n: int) -> str:
    chars = list(text)
    for _ in range(n):
        chars[rng.randrange(len(chars))] = rng.choice("xyzw")
    return "".join(chars)


def test_signatures_deterministic_across_processes():
    texts = ["hello world, a deterministic signature", "中文文本也可以没有分词器"]
    here = MinHasher().signatures(texts)
    code = ("import sys, json; from tinystack.data.dedup.minhash import MinHasher; "
            "print(json.dumps(MinHasher().signatures(json.loads(sys.argv[1])).tolist()))")
    import json
    out = subprocess.run([sys.executable, "-c", code, json.dumps(texts)], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert np.array_equal(np.array(json.loads(out.stdout), dtype=np.uint32), here)
    assert not np.array_equal(MinHasher(MinHashParams(seed=2)).signatures(texts), here)
    # batching must not change a row
    assert np.array_equal(MinHasher().signatures(texts[:1])[0], here[0])


def test_estimate_within_three_sigma_of_exact():
    rng = random.Random(0)
    hasher = MinHasher()
    within, total = 0, 0
    for _ in range(200):
        a = doc(rng)
        b = edit(rng, a, rng.randrange(1, 120))
        j = exact_jaccard(shingle_set(a), shingle_set(b))
        sa, sb = hasher.signatures([a, b])
        est = estimate_jaccard(sa, sb)
        total += 1
        within += abs(est - j) <= 3 * jaccard_std(j, 128) + 1e-9
    assert within / total >= 0.98


def test_cjk_text_gets_char_shingles():
    a = "机器学习是人工智能的一个分支，它使计算机能够在没有明确编程的情况下从数据中学习。" * 3
    b = a.replace("数据", "资料", 1)
    c = "今天天气很好，我们去公园散步吧，顺便买一些水果回家。" * 3
    assert exact_jaccard(shingle_set(a), shingle_set(b)) > 0.85
    idx = NearDupIndex()
    idx.add([a, c])
    m = idx.query([b, "完全不同的句子，讲的是数据库索引和查询优化的问题。"])
    assert m[0] is not None and m[0].index == 0 and m[1] is None


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.85, 0.9, 0.95])
def test_banding_parameters(threshold):
    b, r = optimal_bands(threshold, 128)
    assert b * r <= 128
    # the plain rule agrees with datasketch's own optimiser
    lsh = MinHashLSH(threshold=threshold, num_perm=128)
    assert (b, r) == (lsh.b, lsh.r)
    # the verified-dedup rule sees >= 99.9 % of pairs at the threshold
    b2, r2 = optimal_bands(threshold, 128, min_recall=0.999)
    assert candidate_probability(threshold, b2, r2) >= 0.999
    assert b2 * r2 <= 128


def test_transitive_duplicates_form_one_cluster():
    rng = random.Random(1)
    base = doc(rng, 200)
    chain = [base]
    for _ in range(4):  # each step is a near dup of the previous one, the ends may not be
        chain.append(edit(rng, chain[-1], 12))
    others = [doc(rng, 200) for _ in range(5)]
    recs = [Record(t) for t in [others[0], *chain, *others[1:]]]
    step = NearDedup()
    kept = list(step(recs))
    ids = step.roots.tolist()
    assert len(set(ids[1:6])) == 1 and ids[1] == 1  # the chain is one cluster, root = first member
    assert len(set(ids)) == 1 + 5
    assert [r.extra["cluster_id"] for r in kept] == sorted(set(ids))
    assert step.stats.dropped["near_duplicate"] == 4


def test_exact_duplicate_shares_cluster_and_verification_rejects_far_pairs():
    rng = random.Random(2)
    a = doc(rng)
    recs = [Record(a), Record(doc(rng)), Record(a + "  "), Record(edit(rng, a, 3))]
    removed: list[Record] = []
    step = NearDedup(on_removed=removed.append)
    list(step(recs))
    assert step.stats.dropped == {"exact_duplicate": 1, "near_duplicate": 1}
    assert {r.extra["cluster_id"] for r in removed} == {0}
    # far pairs sharing a band would be candidates; verification must drop them
    sigs = MinHasher().signatures([a, edit(rng, a, 200)])
    pairs, _ = find_pairs(sigs, NearDupParams(verify="estimate"))
    assert len(pairs) == 0


@pytest.mark.parametrize("small_chunks", [False, True])
def test_verified_pairs_equal_exact_ground_truth(small_chunks, monkeypatch):
    """With `small_chunks`, verification fetches texts over many rounds and intersects the
    sets in many small groups (3-bit pair tags: groups of 7 pairs, a few hundred values):
    the same pairs and Jaccard values as in one round."""
    if small_chunks:
        monkeypatch.setattr(nd, "_EXACT_PAIRS", 3)
        monkeypatch.setattr(nd, "_EXACT_MIN_PAIRS", 1)
        monkeypatch.setattr(nd, "_EXACT_CHARS", 2000)
        monkeypatch.setattr(nd, "_VERIFY_VALUES", 500)
        monkeypatch.setattr(nd, "_TAG_BITS", 3)
    rng = random.Random(3)
    texts = []
    for _ in range(30):
        a = doc(rng, 150)
        texts += [a, edit(rng, a, rng.randrange(1, 40))]
    sets = [shingle_set(t) for t in texts]
    truth = {(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))
             if exact_jaccard(sets[i], sets[j]) >= 0.85}
    texts_of = lambda ix: {int(i): texts[i] for i in ix}
    calls = []
    pairs, jac = find_pairs(MinHasher().signatures(texts), NearDupParams(), lambda ix: calls.append(1) or texts_of(ix))
    assert set(map(tuple, pairs.tolist())) == truth
    assert jac.tolist() == [exact_jaccard(sets[i], sets[j]) for i, j in pairs.tolist()]
    assert len(truth) >= 10  # the planted pairs are really there
    assert (len(calls) > 5) == small_chunks
