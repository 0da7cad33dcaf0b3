from __future__ import annotations

import hashlib
import json

import pytest
from data_helpers import distinct_text, read_jsonl_dicts, write_lines

import tinystack.data.pipeline as pipeline_mod
from tinystack.config import DataConfig
from tinystack.data.io.manifest import split_files_hash, verify_data_dir
from tinystack.data.pipeline import prepare
from tinystack.data.split.splitter import SPLITS

N_SOURCES = 12


def _craft(tmp_path):
    """A small corpus whose expected counts are computed from its construction."""
    lines: list[str | bytes] = []
    exp = {"read_rejects": 0, "too_short": 0, "too_long": 0, "dups": 0, "nonblank": 0}
    texts_seen: set[str] = set()
    for s in range(N_SOURCES):
        for i in range(s + 2):  # sources of different sizes
            text = f"Source {s} document {i}: {distinct_text(100 * s + i)}"
            lines.append(json.dumps({"text": text, "source": f"src{s}", "label": "x"}))
            texts_seen.add(text)
    # duplicates, with whitespace variations so only normalisation makes them equal
    for s, i in [(0, 0), (3, 1), (3, 1), (7, 2)]:
        text = f"Source {s} document {i}: {distinct_text(100 * s + i)}   \r\n"
        lines.append(json.dumps({"text": text, "source": f"src{(s + 5) % N_SOURCES}"}))
        exp["dups"] += 1
    lines += [json.dumps({"text": "short", "source": "src1"})] * 3
    exp["too_short"] += 3
    lines.append(json.dumps({"text": distinct_text(9999, 60), "source": "src2"}))  # > 200 chars
    exp["too_long"] += 1
    bad = ["{oops", "[]", '{"text": 1}', b'{"text": "\xfe"}']
    lines += bad
    exp["read_rejects"] += len(bad)
    lines.append("")
    exp["nonblank"] = sum(1 for line in lines if line.strip())
    jsonl = write_lines(tmp_path / "in.jsonl", lines)

    folder = tmp_path / "txt"
    folder.mkdir()
    (folder / "essay.txt").write_text(
        "First paragraph of an essay that is long enough.\n\nSecond paragraph, also long enough to pass.\n\ntiny\n",
        encoding="utf-8",
    )
    exp["nonblank"] += 3
    exp["too_short"] += 1
    return [jsonl, folder], exp


def test_prepare_end_to_end(tmp_path):
    inputs, exp = _craft(tmp_path)
    out = tmp_path / "out"
    m = prepare(inputs, out, DataConfig(min_chars=20, max_chars=200, val_fraction=0.15, test_fraction=0.15))

    steps = {s["name"]: s for s in m["steps"]}
    for s in m["steps"]:
        assert s["in"] == s["kept"] + sum(s["dropped"].values()) == s["kept"] + s["dropped_total"]
    for a, b in zip(m["steps"], m["steps"][1:]):
        assert a["kept"] == b["in"]
    assert steps["read"]["in"] == exp["nonblank"] == m["records_in"]
    assert steps["read"]["dropped_total"] == exp["read_rejects"] == m["rejects"]["total"]
    assert steps["length_filter"]["dropped"] == {"too_short": exp["too_short"], "too_long": exp["too_long"]}
    assert steps["exact_dedup"]["dropped"] == {"exact_duplicate": exp["dups"]}
    assert m["dedup_rate"] == round(exp["dups"] / steps["exact_dedup"]["in"], 6)

    # Files agree with the manifest; sources never straddle splits; val/test non-empty.
    src_sets = {}
    for k in SPLITS:
        rows = read_jsonl_dicts(out / f"{k}.jsonl")
        assert len(rows) == m["splits"][k]["records"] > 0
        src_sets[k] = {r["source"] for r in rows}
        assert len(src_sets[k]) == m["splits"][k]["sources"]
    assert sum(m["splits"][k]["records"] for k in SPLITS) == steps["exact_dedup"]["kept"] == m["records_out"]
    assert not (src_sets["train"] & src_sets["val"] or src_sets["train"] & src_sets["test"]
                or src_sets["val"] & src_sets["test"])

    rejected = read_jsonl_dicts(out / "rejected.jsonl")
    assert len(rejected) == exp["read_rejects"] and m["rejects"]["file"] == "rejected.jsonl"
    assert json.loads((out / "manifest.json").read_text()) == m
    assert m["hash"] == split_files_hash(out)
    assert verify_data_dir(out)["hash"] == m["hash"]
    files = [tmp_path / "in.jsonl", tmp_path / "txt" / "essay.txt"]
    assert [(i["path"], i["sha256"]) for i in m["inputs"]] == [(str(f), hashlib.sha256(f.read_bytes()).hexdigest())
                                                              for f in files]
    assert m["warnings"] == []

    # Editing a split afterwards is detected.
    with open(out / "val.jsonl", "a", encoding="utf-8") as f:
        f.write('{"text": "sneaked in", "label": null, "source": "x"}\n')
    with pytest.raises(ValueError, match="do not match"):
        verify_data_dir(out)


def test_prepare_is_deterministic_and_removes_stale_rejects(tmp_path):
    inputs, _ = _craft(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    ma, mb = prepare(inputs, a, DataConfig(min_chars=20)), prepare(inputs, b, DataConfig(min_chars=20))
    assert ma["hash"] == mb["hash"]
    assert all((a / f"{k}.jsonl").read_bytes() == (b / f"{k}.jsonl").read_bytes() for k in SPLITS)
    assert (a / "rejected.jsonl").exists()
    clean = write_lines(tmp_path / "clean.jsonl",
                        [json.dumps({"text": f"clean document number {i}", "source": f"s{i}"}) for i in range(5)])
    m = prepare([clean], a, DataConfig(min_chars=5))
    assert not (a / "rejected.jsonl").exists() and m["rejects"]["file"] is None


def test_crash_while_writing_splits_leaves_no_manifest(tmp_path, monkeypatch):
    inputs, _ = _craft(tmp_path)
    out = tmp_path / "out"
    prepare(inputs, out, DataConfig(min_chars=20))
    old_train = (out / "train.jsonl").read_bytes()
    real = pipeline_mod.write_jsonl

    def failing(path, records):
        if path.name == "val.jsonl":
            raise OSError("disk full")
        return real(path, records)

    monkeypatch.setattr(pipeline_mod, "write_jsonl", failing)
    with pytest.raises(OSError):
        prepare(inputs, out, DataConfig(min_chars=20, max_chars=200))  # drops a train record -> new train.jsonl
    assert not (out / "manifest.json").exists()  # the run is visibly uncommitted
    with pytest.raises(FileNotFoundError):
        verify_data_dir(out)
    assert (out / "train.jsonl").read_bytes() != old_train  # new train written; val kept whole:
    assert all(json.loads(line) for line in (out / "val.jsonl").read_text().splitlines())
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_bad_arguments_fail_before_touching_outputs(tmp_path):
    inputs, _ = _craft(tmp_path)
    out = tmp_path / "out"
    m = prepare(inputs, out, DataConfig(min_chars=20))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for kwargs in [dict(split_by="random"), dict(val_fraction=0.6, test_fraction=0.6), dict(split_by="time")]:
        with pytest.raises(ValueError):
            prepare(inputs, out, DataConfig(**kwargs))
    with pytest.raises(FileNotFoundError):
        prepare([tmp_path / "nope.jsonl"], out)
    with pytest.raises(ValueError):
        prepare([], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert verify_data_dir(out)["hash"] == m["hash"]


def test_prepare_time_split(tmp_path):
    rows = [
        {"text": f"event log entry {i}: {distinct_text(i, 6)}", "source": "log",
         "timestamp": f"2024-0{1 + i % 6}-15T00:00:00Z"}
        for i in range(30)
    ]
    rows.append({"text": "an entry that has no timestamp at all", "source": "log"})
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(r) for r in rows])
    m = prepare([path], tmp_path / "out", DataConfig(split_by="time", val_from="2024-04-01", test_from="2024-06-01",
                                                     min_chars=10))
    months = [1 + i % 6 for i in range(30)]
    assert m["splits"]["train"]["records"] == sum(mo < 4 for mo in months)
    assert m["splits"]["val"]["records"] == sum(4 <= mo < 6 for mo in months)
    assert m["splits"]["test"]["records"] == sum(mo >= 6 for mo in months)
    assert next(s for s in m["steps"] if s["name"] == "split_by_time")["dropped"] == {"missing_timestamp": 1}
    assert m["rejects"]["by_reason"] == {"missing_timestamp": 1}
    (entry,) = read_jsonl_dicts(tmp_path / "out" / "rejected.jsonl")
    assert (entry["line"], entry["reason"]) == (31, "missing_timestamp")
    for k, lo, hi in [("train", "", "2024-04"), ("val", "2024-04", "2024-06"), ("test", "2024-06", "9")]:
        assert all(lo <= r["timestamp"] < hi for r in read_jsonl_dicts(tmp_path / "out" / f"{k}.jsonl"))


def test_few_sources_warns_about_empty_splits(tmp_path):
    path = write_lines(tmp_path / "one.jsonl",
                       [json.dumps({"text": f"only one source, doc {i}: {distinct_text(i, 5)}"}) for i in range(5)])
    m = prepare([path], tmp_path / "out", DataConfig(min_chars=5))
    assert m["splits"]["train"]["records"] == 5
    assert m["warnings"] == ["val split is empty", "test split is empty"]
