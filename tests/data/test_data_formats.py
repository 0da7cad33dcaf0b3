"""CSV / Parquet readers, field mapping, Parquet output, and malformed input -> rejected.jsonl."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from data_helpers import distinct_text, read_jsonl_dicts, write_lines

from tinystack.config import DataConfig
from tinystack.data.io.formats import FieldMap, read_csv, read_parquet, write_records
from tinystack.data.io.readers import read_inputs
from tinystack.data.io.records import Record
from tinystack.data.io.rejects import Rejects
from tinystack.data.pipeline import prepare


def test_field_mapping_for_jsonl_csv_parquet(tmp_path):
    fm = FieldMap(text="content", source="url", id="doc_id")
    j = write_lines(tmp_path / "a.jsonl",
                    [json.dumps({"content": "hello from jsonl", "url": "u1", "doc_id": 7, "x": 1})])
    c = tmp_path / "b.csv"
    c.write_text('content,url,doc_id\n"multi\nline csv text",u2,k9\nbare row,,\n', encoding="utf-8")
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"content": ["from parquet", None], "url": ["u3", "u4"]}), p)
    rj = Rejects()
    recs = list(read_inputs([j, c, p], rj, fields=fm))
    assert [(r.text, r.source, r.id) for r in recs] == [
        ("hello from jsonl", "u1", 7), ("multi\nline csv text", "u2", "k9"), ("bare row", "b.csv", None),
        ("from parquet", "u3", None)]
    assert recs[0].extra == {"x": 1}
    assert recs[1].origin == (str(c), 2) and recs[2].origin == (str(c), 4)  # physical line of the row
    assert [(e["file"], e["line"], e["reason"]) for e in rj.entries] == [(str(p), 2, "missing_text")]


def test_csv_and_parquet_malformed_rows_are_rejected_with_line(tmp_path):
    c = tmp_path / "bad.csv"
    c.write_bytes(b"text,source\nok text here,s\n\xff\xfe broken,s\n,s\ntoo,many,cells\n")
    rj = Rejects()
    assert [r.text for r in read_csv(c, rj)] == ["ok text here"]
    assert [(e["line"], e["reason"]) for e in rj.entries] == [(3, "invalid_utf8"), (4, "missing_text"), (5, "bad_row")]
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": ["fine", "  ", "also fine"], "timestamp": [None, None, "not a date"]}), p)
    rj = Rejects()
    assert [r.text for r in read_parquet(p, rj)] == ["fine"]
    assert [(e["line"], e["reason"]) for e in rj.entries] == [(2, "empty_text"), (3, "bad_timestamp")]


def test_parquet_output_round_trips(tmp_path):
    recs = [Record("héllo", source="s", label={"a": 1}, timestamp="2024-01-01T00:00:00Z", id=3,
                   extra={"cluster_id": 0}), Record("second", source="t")]
    assert write_records(tmp_path / "o.parquet", recs) == 2
    assert list(read_parquet(tmp_path / "o.parquet", Rejects())) == recs
    assert pq.read_table(tmp_path / "o.parquet").column_names == ["text", "source", "label", "timestamp", "id", "extra"]


def test_every_malformed_kind_lands_in_rejected_and_counts_add_up(tmp_path):
    good = [json.dumps({"text": distinct_text(i, 10), "source": f"s{i % 5}"}) for i in range(20)]
    bad = {
        "invalid_json": "{not json",
        "not_object": "[1, 2]",
        "missing_text": json.dumps({"source": "x"}),
        "text_not_string": json.dumps({"text": 5}),
        "empty_text": json.dumps({"text": "   "}),
        "bad_source": json.dumps({"text": "fine text here", "source": 3}),
        "bad_timestamp": json.dumps({"text": "fine text here", "timestamp": "yesterday"}),
        "bad_id": json.dumps({"text": "fine text here", "id": [1]}),
        "invalid_unicode": '{"text": "lone \\ud800 surrogate"}',
        "invalid_utf8": b'{"text": "\xff\xfe"}',
    }
    lines = good[:10] + list(bad.values()) + good[10:]
    path = write_lines(tmp_path / "in.jsonl", lines)
    m = prepare([path], tmp_path / "out", DataConfig(min_chars=5))
    rej = read_jsonl_dicts(tmp_path / "out" / "rejected.jsonl")
    assert {r["reason"]: r["line"] for r in rej} == {reason: 11 + i for i, reason in enumerate(bad)}
    assert all(r["file"] == str(path) for r in rej)
    assert m["rejects"]["by_reason"] == {k: 1 for k in bad}
    read = m["steps"][0]
    assert read["in"] == len(lines) and read["kept"] == len(good) and read["dropped"] == {k: 1 for k in bad}
    for s in m["steps"]:
        assert s["in"] == s["kept"] + s["dropped_total"]
    for a, b in zip(m["steps"], m["steps"][1:]):
        assert a["kept"] == b["in"]
    assert m["records_out"] == m["steps"][-1]["kept"] == sum(v["records"] for v in m["splits"].values())
