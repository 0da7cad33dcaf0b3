from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from tinystack.data.io.records import Record
from tinystack.data.io.rejects import Rejects
from tinystack.data.split.splitter import SPLITS, Splitter, assign_sources, split_by_source, split_by_time


def _random_counts(rng: random.Random) -> dict[str, int]:
    n_sources = rng.randint(1, 60)
    return {f"src-{rng.random():.6f}": rng.choice([1, 1, 2, 3, 10, 100, 1000]) for _ in range(n_sources)}


def test_source_split_properties_random_configs():
    rng = random.Random(7)
    for _ in range(400):
        counts = _random_counts(rng)
        vf, tf = rng.choice([(0.05, 0.05), (0.1, 0.2), (0.3, 0.3), (0.01, 0.0), (0.0, 0.5)])
        assign = assign_sources(counts, vf, tf)
        assert set(assign) == set(counts) and set(assign.values()) <= set(SPLITS)  # one split per source
        per = {k: sum(n for s, n in counts.items() if assign[s] == k) for k in SPLITS}
        members = {k: [s for s in counts if assign[s] == k] for k in SPLITS}
        assert members["train"], (counts, assign)
        if len(counts) >= 3:
            assert bool(members["val"]) == (vf > 0) and bool(members["test"]) == (tf > 0)
        total = sum(counts.values())
        for k, frac in (("val", vf), ("test", tf)):
            # Within budget, unless the non-empty guarantee had to force exactly one source in.
            assert per[k] <= frac * total or len(members[k]) == 1
        # Deterministic and independent of dict order.
        shuffled = dict(rng.sample(list(counts.items()), len(counts)))
        assert assign_sources(shuffled, vf, tf) == assign


def test_source_split_one_huge_source_cannot_swallow_val():
    counts = {"huge": 10_000, "a": 3, "b": 4, "c": 5}
    assign = assign_sources(counts, 0.05, 0.05)
    assert assign["huge"] == "train"
    assert "val" in assign.values() and "test" in assign.values()


def test_source_split_fractions_approximate():
    rng = random.Random(3)
    counts = {f"s{i}": rng.randint(1, 5) for i in range(500)}
    total = sum(counts.values())
    assign = assign_sources(counts, 0.1, 0.05)
    for k, frac in (("val", 0.1), ("test", 0.05)):
        got = sum(n for s, n in counts.items() if assign[s] == k)
        assert frac * total - 5 <= got <= frac * total  # greedy fill: within one source of the budget


def test_split_by_source_keeps_order_and_groups():
    rng = random.Random(5)
    recs = [Record(text=f"t{i}", source=f"s{rng.randint(0, 9)}", id=i) for i in range(300)]
    splits = split_by_source(recs, 0.1, 0.1)
    assert sum(len(v) for v in splits.values()) == len(recs)
    srcs = [{r.source for r in splits[k]} for k in SPLITS]
    assert not (srcs[0] & srcs[1] or srcs[0] & srcs[2] or srcs[1] & srcs[2])
    for k in SPLITS:
        ids = [r.id for r in splits[k]]
        assert ids == sorted(ids)  # input order kept within a split
    shuffled = rng.sample(recs, len(recs))
    again = split_by_source(shuffled, 0.1, 0.1)
    assert [{r.source for r in again[k]} for k in SPLITS] == srcs


def test_assignment_does_not_depend_on_python_hash_seed():
    code = (
        "import json; from tinystack.data.split.splitter import assign_sources;"
        "print(json.dumps(assign_sources({f'source-{i}': i % 5 + 1 for i in range(40)}, 0.1, 0.1), sort_keys=True))"
    )
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outs.add(proc.stdout)
    assert len(outs) == 1
    assert set(json.loads(outs.pop()).values()) == set(SPLITS)


@pytest.mark.parametrize("vf, tf", [(-0.1, 0.1), (1.0, 0.0), (0.5, 0.5), (0.7, 0.4)])
def test_bad_fractions_raise_early(vf, tf):
    with pytest.raises(ValueError):
        Splitter("source", val_fraction=vf, test_fraction=tf)


def _timed(ts: list[str | None]) -> list[Record]:
    return [Record(text=f"doc {i}", source=f"s{i % 2}", timestamp=t, id=i, origin=("in.jsonl", i + 1))
            for i, t in enumerate(ts)]


def test_time_split_honours_cutoffs():
    ts = [
        "2023-12-31T23:59:59Z",  # train
        "2024-01-01T00:00:00Z",  # == val_from -> val
        "2024-01-01T01:00:00+01:00",  # same instant as val_from -> val
        "2024-06-30T23:59:59",  # naive = UTC -> val
        "2024-07-01T00:00:00Z",  # == test_from -> test
        "2030-01-01",  # test
        "2000-01-01",  # train
    ]
    splits, missing = split_by_time(_timed(ts), "2024-01-01T00:00:00Z", "2024-07-01")
    assert missing == 0
    assert {k: [r.id for r in v] for k, v in splits.items()} == {"train": [0, 6], "val": [1, 2, 3], "test": [4, 5]}


def test_time_split_missing_timestamps_are_rejected_not_lost():
    rj = Rejects()
    sp = Splitter("time", val_from="2024-01-01", test_from="2024-02-01", rejects=rj)
    out = sp(_timed(["2023-01-01", None, "2024-01-15", None, "2024-03-01"]))
    assert [len(out[k]) for k in SPLITS] == [1, 1, 1]
    assert sp.stats.dropped == {"missing_timestamp": 2}
    sp.stats.check()
    assert [(e["line"], e["reason"]) for e in rj.entries] == [(2, "missing_timestamp"), (4, "missing_timestamp")]
    assert json.loads(rj.entries[0]["raw"])["id"] == 1


def test_time_split_errors():
    with pytest.raises(ValueError, match="no record has a 'timestamp'"):
        split_by_time(_timed([None, None]), "2024-01-01", "2024-02-01")
    for vf, tf in [("", "2024-01-01"), ("2024-03-01", "2024-02-01"), ("soon", "2024-02-01")]:
        with pytest.raises(ValueError):
            Splitter("time", val_from=vf, test_from=tf)
    with pytest.raises(ValueError):
        Splitter("random")
