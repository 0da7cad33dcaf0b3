"""Leakage-free splits: sources never straddle splits, no near duplicate crosses splits."""
from __future__ import annotations

import json
import random

from data_helpers import distinct_text, read_jsonl_dicts, write_lines

from tinystack.config import DataConfig
from tinystack.data.dedup.index import NearDupIndex
from tinystack.data.dedup.near_duplicates import NearDupParams
from tinystack.data.dedup.shingles import exact_jaccard, shingle_set
from tinystack.data.io.records import Record
from tinystack.data.pipeline import prepare
from tinystack.data.split.splitter import SPLITS, Splitter, StreamSplitter


def _edit(text: str, rng: random.Random, n: int = 3) -> str:
    c = list(text)
    for _ in range(n):
        c[rng.randrange(len(c))] = "#"
    return "".join(c)


def _corpus(tmp_path, n_sources=30, per_source=6, copies=25):
    """Distinct documents, plus near copies planted in *other* sources (cross-source leaks)."""
    rng = random.Random(5)
    rows = [{"text": distinct_text(1000 * s + i, 40), "source": f"site{s}"}
            for s in range(n_sources) for i in range(per_source)]
    for k in range(copies):
        src = rows[rng.randrange(len(rows))]
        rows.append({"text": _edit(src["text"], rng), "source": f"mirror{k}"})
    return write_lines(tmp_path / "in.jsonl", [json.dumps(r) for r in rows]), rows


def _cross_split_pairs(out):
    split_rows = {k: read_jsonl_dicts(out / f"{k}.jsonl") for k in SPLITS}
    sets = {k: [shingle_set(r["text"]) for r in v] for k, v in split_rows.items()}
    found = 0
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        found += sum(exact_jaccard(x, y) >= 0.85 for x in sets[a] for y in sets[b])
    return split_rows, found


def test_leakage_is_removed_from_val_and_test_when_dedup_is_off(tmp_path):
    path, _ = _corpus(tmp_path)
    out = tmp_path / "out"
    m = prepare([path], out, DataConfig(near_dedup=False, val_fraction=0.2, test_fraction=0.2))
    split_rows, cross = _cross_split_pairs(out)
    assert cross == 0
    leak = next(s for s in m["steps"] if s["name"] == "leakage")
    assert leak["dropped_total"] == m["leakage"] > 0  # the planted mirrors that landed in val/test
    assert leak["extra"]["leaked"]["val"] + leak["extra"]["leaked"]["test"] == m["leakage"]
    sources = {k: {r["source"] for r in v} for k, v in split_rows.items()}
    assert not (sources["train"] & sources["val"] or sources["train"] & sources["test"]
                or sources["val"] & sources["test"])
    # without the check the same run leaks: the test above is not vacuous
    m2 = prepare([path], tmp_path / "leaky", DataConfig(near_dedup=False, leakage_threshold=0.0, val_fraction=0.2,
                                                        test_fraction=0.2))
    assert _cross_split_pairs(tmp_path / "leaky")[1] > 0 and m2["leakage"] == 0


def test_default_pipeline_has_no_cross_split_near_duplicates(tmp_path):
    path, rows = _corpus(tmp_path)
    out = tmp_path / "out"
    m = prepare([path], out, DataConfig(val_fraction=0.2, test_fraction=0.2))
    assert _cross_split_pairs(out)[1] == 0
    near = next(s for s in m["steps"] if s["name"] == "near_dedup")
    assert near["dropped"].get("near_duplicate", 0) >= 20  # the planted copies went at dedup time
    for k in SPLITS:
        assert all(isinstance(r["cluster_id"], int) for r in read_jsonl_dicts(out / f"{k}.jsonl"))


def test_stream_splitter_matches_in_memory_splitter():
    recs = [Record(f"text {i}", source=f"s{i % 9}", timestamp=f"2024-0{1 + i % 6}-01") for i in range(60)]
    for kwargs in (dict(split_by="source", val_fraction=0.2, test_fraction=0.2),
                   dict(split_by="time", val_from="2024-03-01", test_from="2024-05-01")):
        mem = Splitter(**kwargs)(recs)
        stream = StreamSplitter(**kwargs)
        routed = {k: [] for k in SPLITS}
        for name, r in stream.route(recs):
            routed[name].append(r)
        assert routed == mem


def test_index_from_jsonl_answers_eval_queries(tmp_path):
    texts = [distinct_text(i, 60) for i in range(50)]
    path = write_lines(tmp_path / "train.jsonl", [json.dumps({"text": t}) for t in texts])
    idx = NearDupIndex.from_jsonl(path, NearDupParams(threshold=0.8))
    rng = random.Random(0)
    queries = [_edit(texts[7], rng, 2), distinct_text(999, 60), texts[30]]
    assert idx.contains(queries) == [True, False, True]
    m = idx.query(queries)
    assert m[0].index == 7 and 0.8 <= m[0].jaccard < 1 and m[2].jaccard == 1.0


def test_leakage_reusing_dedup_signatures_equals_hashing_again(tmp_path, monkeypatch):
    """Near dedup at 0.97 keeps the planted copies (J ~0.75-0.9); the leakage check at
    0.6 must catch those that cross splits, with the signatures the dedup step made
    (the default) exactly as with signatures computed from the written files."""
    import numpy as np

    from tinystack.data.split import leakage

    rng = random.Random(9)
    rows = [{"text": distinct_text(1000 * s + i, 40), "source": f"site{s}"} for s in range(30) for i in range(6)]
    for k in range(40):
        rows.append({"text": _edit(rows[rng.randrange(180)]["text"], rng, rng.randrange(6, 12)), "source": f"m{k}"})
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(r) for r in rows])
    kw = dict(dedup_threshold=0.97, leakage_threshold=0.6, val_fraction=0.2, test_fraction=0.2)
    adopted = []
    real_adopt = leakage.LeakageCheck.adopt
    monkeypatch.setattr(leakage.LeakageCheck, "adopt", lambda self, *a: adopted.append(1) or real_adopt(self, *a))
    m1 = prepare([path], tmp_path / "reuse", DataConfig(**kw))
    monkeypatch.setattr(leakage.LeakageCheck, "adopt", lambda self, *a: None)  # -> hash the files again
    m2 = prepare([path], tmp_path / "hash", DataConfig(**kw))
    assert adopted == [1]
    assert m1["leakage"] == m2["leakage"] > 0
    assert m1["hash"] == m2["hash"]  # identical split files
    l1, l2 = (next(s for s in m["steps"] if s["name"] == "leakage") for m in (m1, m2))
    assert l1["dropped"] == l2["dropped"] and l1["extra"]["leaked"] == l2["extra"]["leaked"]
    assert _cross_split_pairs(tmp_path / "reuse")[1] == 0  # none >= 0.85 crosses splits
    # compaction in place equals a gather, across chunk boundaries
    monkeypatch.setattr(leakage, "_COMPACT_CHUNK", 7)
    buf = np.arange(100 * 3, dtype=np.uint32).reshape(100, 3)
    keep = np.sort(np.random.default_rng(0).choice(100, 41, replace=False))
    want = buf[keep].copy()
    assert np.array_equal(leakage.compact_rows(buf, keep), want)
