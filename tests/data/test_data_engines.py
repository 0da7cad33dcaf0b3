"""`--workers 2` and the Ray Data engine give the same survivors and clusters as one worker."""
from __future__ import annotations

import json
import random

import pytest
from data_helpers import distinct_text, read_jsonl_dicts, write_lines

from tinystack.data.dedup import near_step as nd
from tinystack.data.dedup.near_step import NearDedup
from tinystack.data.io.formats import FieldMap
from tinystack.data.io.records import Record
from tinystack.data.tools import dedup_files


def _records(n_base=120, seed=11):
    rng = random.Random(seed)
    out = []
    for i in range(n_base):
        t = distinct_text(i, 50)
        out.append(Record(t, source=f"s{i % 9}"))
        for _ in range(rng.choice([0, 0, 1, 2])):
            c = list(t)
            for _ in range(rng.randrange(1, 12)):
                c[rng.randrange(len(c))] = rng.choice("xyz")
            out.append(Record("".join(c), source=f"s{rng.randrange(9)}"))
        if rng.random() < 0.1:
            out.append(Record(t + "  ", source="copy"))  # exact duplicate after normalisation
    return out


def _run(step, recs):
    kept = [(r.text, r.extra["cluster_id"]) for r in step(recs)]
    return kept, step.roots.tolist(), dict(step.stats.dropped)


def test_two_workers_match_one(monkeypatch):
    monkeypatch.setattr(nd, "BATCH", 16)  # several batches, so the pool really splits the work
    recs = _records()
    one = _run(NearDedup(workers=1), recs)
    two = _run(NearDedup(workers=2), recs)
    assert one == two
    assert one[2]["near_duplicate"] > 10 and one[2]["exact_duplicate"] > 0


@pytest.mark.slow
def test_ray_engine_matches_single_process():
    ray = pytest.importorskip("ray", reason="the [dist] extra (ray[data]) is not installed")
    from tinystack.data.dedup.ray_engine import RayNearDedup, ensure_ray

    recs = _records(80)
    ensure_ray(num_cpus=2)
    try:
        assert _run(RayNearDedup(batch_size=32), recs) == _run(NearDedup(), recs)
    finally:
        ray.shutdown()


def test_dedup_command_outputs(tmp_path):
    rng = random.Random(3)
    rows = []
    for i in range(30):
        t = distinct_text(i, 40)
        rows.append({"content": t, "url": f"u{i}", **({"id": f"doc{i}"} if i % 2 else {})})
        if i % 3 == 0:
            c = list(t)
            c[rng.randrange(len(c))] = "#"
            rows.append({"content": "".join(c), "url": f"mirror{i}"})
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(r) for r in rows])
    from typer.testing import CliRunner

    from tinystack.data.commands import app

    res = CliRunner().invoke(app, ["dedup", "--input", str(path), "--out", str(tmp_path / "o"),
                                   "--dedup-threshold", "0.85", "--text-field", "content", "--source-field", "url",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    kept = read_jsonl_dicts(tmp_path / "o" / "kept.jsonl")
    dups = read_jsonl_dicts(tmp_path / "o" / "duplicates.jsonl")
    assert len(kept) == 30 and len(dups) == 10 and "dedup" in res.output
    ids = [r["id"] for r in kept + dups]
    assert len(set(ids)) == len(ids)
    assert [r["id"] for r in kept[:2]] == ["u0:1", "doc1"]  # input id kept; stable id from source and line
    kept_cluster = {r["cluster_id"] for r in kept}
    assert all(d["cluster_id"] in kept_cluster for d in dups)
    summary = json.loads((tmp_path / "o" / "dedup.json").read_text())
    assert summary["clusters"] == 10 and summary["records_in"] == 40
    # same result through the library call
    again = dedup_files([path], tmp_path / "o2", fields=FieldMap(text="content", source="url"))
    assert again["clusters"] == 10
