from __future__ import annotations

import json

import pytest

from tinystack.data.io.readers import read_jsonl
from tinystack.data.io.records import Record, RecordError, parse_timestamp, write_jsonl
from tinystack.data.io.rejects import Rejects


def test_round_trip_with_extra_and_unicode(tmp_path):
    d = {
        "text": "Ünïcödé — 日本語 and emoji 🐍\twith tab",
        "label": {"nested": [1, 2]},
        "source": "src/α",
        "timestamp": "2024-03-01T12:00:00Z",
        "id": 7,
        "lang": "de",
        "meta": {"k": [None, True, 1.5]},
    }
    r = Record.from_dict(d)
    assert r.extra == {"lang": "de", "meta": {"k": [None, True, 1.5]}}
    assert r.to_dict() == d
    assert Record.from_dict(r.to_dict()) == r
    # Through a file: same dicts back, and the file is readable UTF-8 (not \u escapes).
    path = tmp_path / "r.jsonl"
    assert write_jsonl(path, [r, Record(text="second")]) == 2
    assert "日本語" in path.read_text(encoding="utf-8")
    back = list(read_jsonl(path, Rejects()))
    assert [b.to_dict() for b in back] == [d, {"text": "second", "label": None, "source": "unknown"}]


def test_to_dict_omits_unset_optional_keys():
    assert Record(text="x", source="s").to_dict() == {"text": "x", "label": None, "source": "s"}


def test_extra_cannot_shadow_core_key():
    r = Record(text="real", extra={"text": "fake"})
    assert r.to_dict()["text"] == "real"


def test_source_default():
    assert Record.from_dict({"text": "t"}).source == "unknown"
    assert Record.from_dict({"text": "t", "source": None}, default_source="f.jsonl").source == "f.jsonl"


@pytest.mark.parametrize(
    "d, reason",
    [
        ([1, 2], "not_object"),
        ("text", "not_object"),
        ({"label": "x"}, "missing_text"),
        ({"text": None}, "missing_text"),
        ({"text": 5}, "text_not_string"),
        ({"text": ["a"]}, "text_not_string"),
        ({"text": ""}, "empty_text"),
        ({"text": " \n\t "}, "empty_text"),
        ({"text": "t", "source": 3}, "bad_source"),
        ({"text": "t", "source": ""}, "bad_source"),
        ({"text": "t", "timestamp": "yesterday"}, "bad_timestamp"),
        ({"text": "t", "timestamp": 1700000000}, "bad_timestamp"),
        ({"text": "t", "timestamp": "2024-13-01"}, "bad_timestamp"),
        ({"text": "t", "id": 1.5}, "bad_id"),
        ({"text": "t", "id": True}, "bad_id"),
    ],
)
def test_from_dict_rejects_with_reason(d, reason):
    with pytest.raises(RecordError) as e:
        Record.from_dict(d)
    assert e.value.reason == reason
    assert str(e.value)  # a human-readable message too


def test_timestamps_naive_is_utc_and_z_accepted():
    a = parse_timestamp("2024-01-01T00:00:00")
    b = parse_timestamp("2024-01-01T00:00:00Z")
    c = parse_timestamp("2024-01-01T01:00:00+01:00")
    assert a == b == c
    assert Record.from_dict({"text": "t", "timestamp": "2024-01-01"}).when() == a


class Boom(RuntimeError):
    pass


def _exploding(n_ok: int):
    for i in range(n_ok):
        yield Record(text=f"new {i}")
    raise Boom("crash mid-write")


def test_write_jsonl_crash_leaves_old_file_intact(tmp_path):
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [Record(text="old one"), Record(text="old two")])
    before = path.read_bytes()
    with pytest.raises(Boom):
        write_jsonl(path, _exploding(1000))  # enough to have written bytes to the temp file
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp file left behind


def test_write_jsonl_crash_on_new_file_leaves_nothing(tmp_path):
    path = tmp_path / "sub" / "new.jsonl"
    with pytest.raises(Boom):
        write_jsonl(path, _exploding(3))
    assert not path.exists()
    assert list(path.parent.iterdir()) == []


def test_rejects_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "rejected.jsonl"
    rj = Rejects()
    rj.add("f", 1, "invalid_json", "{")
    rj.write(path)
    before = path.read_bytes()
    rj.add("f", 2, "invalid_json", "}")

    def broken_dumps(*a, **k):
        raise Boom("disk on fire")

    monkeypatch.setattr(json, "dumps", broken_dumps)
    with pytest.raises(Boom):
        rj.write(path)
    monkeypatch.undo()
    assert path.read_bytes() == before


def test_spool_returns_every_record_with_its_origin_in_order():
    """Batched pickles: records across several full batches and a partial one come back
    equal, with origin, as often as asked; `texts` reads any subset; appending after a
    pass is allowed."""
    from tinystack.data.io import spool as spool_mod
    from tinystack.data.io.spool import Spool

    n = 2 * spool_mod.BATCH + 37
    recs = [Record(text=f"doc {i} 日本語", source=f"s{i % 3}", label={"k": [i]} if i % 2 else None,
                   timestamp="2024-03-01T12:00:00Z" if i % 5 == 0 else None, id=i if i % 7 else None,
                   extra={"lang": "ja"} if i % 4 == 0 else {}, origin=("in.jsonl", i + 1)) for i in range(n)]
    s = Spool()
    try:
        for r in recs:
            s.append(r)
        assert len(s) == n
        first, second = list(s), list(s)
        assert first == recs and second == recs and [r.origin for r in first] == [r.origin for r in recs]
        wanted = {0, 1, spool_mod.BATCH - 1, spool_mod.BATCH, n - 1, n + 5}
        assert s.texts(wanted) == {i: recs[i].text for i in wanted if i < n}
        s.append(Record(text="late", origin=("x", 1)))
        assert [r.text for r in s][-2:] == [recs[-1].text, "late"] and s.texts({n}) == {n: "late"}
    finally:
        s.close()
