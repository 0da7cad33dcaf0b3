from __future__ import annotations

import pytest
from data_helpers import read_jsonl_dicts, write_lines

from tinystack.data.io.readers import input_files, read_inputs, read_jsonl, read_text
from tinystack.data.io.rejects import Rejects

# (raw line, expected reject reason or None if valid); blank lines are not records.
CASES: list[tuple[str | bytes, str | None]] = [
    ('{"text": "a valid record", "source": "s1"}', None),
    ('{"text": "unterminated', "invalid_json"),
    ("[1, 2, 3]", "not_object"),
    ('"just a string"', "not_object"),
    ('{"label": "no text"}', "missing_text"),
    ('{"text": 42}', "text_not_string"),
    (b'{"text": "caf\xe9 latin-1"}', "invalid_utf8"),
    ('{"text": "ok", "timestamp": "not a date"}', "bad_timestamp"),
    ("", None),
    ("   ", None),
    ('{"text": "lone \\ud800 surrogate"}', "invalid_unicode"),
    ('{"text": "   "}', "empty_text"),
    ('{"text": "fine", "source": 12}', "bad_source"),
    ('{"text": "ünïcode ok", "timestamp": "2024-05-01T10:00:00+02:00"}', None),
]


def test_every_malformed_kind_is_rejected_with_line_and_reason(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [raw for raw, _ in CASES])
    rj = Rejects()
    recs = list(read_jsonl(path, rj))

    expected = [(i, reason) for i, (_, reason) in enumerate(CASES, start=1) if reason]
    assert [(e["line"], e["reason"]) for e in rj.entries] == expected
    assert all(e["file"] == str(path) and e["detail"] for e in rj.entries)
    n_nonblank = sum(1 for raw, _ in CASES if (raw.strip() if isinstance(raw, str) else raw.strip()))
    assert len(recs) + rj.total == n_nonblank  # nothing silently lost
    assert sum(rj.counts.values()) == len(expected)
    # The valid records keep their provenance; a missing source becomes the file name.
    assert [r.origin[1] for r in recs] == [1, 14]
    assert recs[1].source == "in.jsonl" and recs[0].source == "s1"

    out = tmp_path / "rejected.jsonl"
    assert rj.write(out) == len(expected)
    rows = read_jsonl_dicts(out)
    assert [(r["line"], r["reason"]) for r in rows] == expected
    assert set(rows[0]) >= {"file", "line", "reason", "raw"}
    bad_utf8 = next(r for r in rows if r["reason"] == "invalid_utf8")
    assert "\\xe9" in bad_utf8["raw"]  # original bytes recoverable
    assert rows[0]["raw"] == '{"text": "unterminated'


def test_bom_and_crlf_lines(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "first"}\r\n{"text": "second"}\r\n')
    rj = Rejects()
    assert [r.text for r in read_jsonl(path, rj)] == ["first", "second"]
    assert rj.total == 0


@pytest.fixture
def text_folder(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("Para one line one.\nline two.\n\n\n  \nPara two.\n", encoding="utf-8")
    (root / "sub" / "b.txt").write_bytes(b"Only block\r\nwith CRLF\r\n")
    (root / "bad.txt").write_bytes(b"good block\n\nbad \xff line\nrest of block\n\nlast good\n")
    (root / "notes.md").write_text("ignored: not .txt", encoding="utf-8")
    return root


def test_read_text_blocks(text_folder):
    rj = Rejects()
    recs = list(read_text(text_folder, rj, mode="blocks"))
    got = [(r.source, r.id, r.text) for r in recs]
    assert got == [
        ("a.txt", "a.txt:1", "Para one line one.\nline two."),
        ("a.txt", "a.txt:6", "Para two."),
        ("bad.txt", "bad.txt:1", "good block"),
        ("bad.txt", "bad.txt:6", "last good"),
        ("sub/b.txt", "sub/b.txt:1", "Only block\nwith CRLF"),
    ]
    assert all(r.label is None for r in recs)
    assert [(e["file"].endswith("bad.txt"), e["line"], e["reason"]) for e in rj.entries] == [(True, 3, "invalid_utf8")]


def test_read_text_file_mode(text_folder):
    rj = Rejects()
    recs = list(read_text(text_folder, rj, mode="file"))
    assert [r.source for r in recs] == ["a.txt", "sub/b.txt"]
    assert recs[0].text.startswith("Para one") and "Para two." in recs[0].text
    assert [(e["line"], e["reason"]) for e in rj.entries] == [(3, "invalid_utf8")]


def test_read_text_single_file_and_bad_mode(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("alpha\n\nbeta\n", encoding="utf-8")
    assert [(r.source, r.text) for r in read_text(f, Rejects())] == [("one.txt", "alpha"), ("one.txt", "beta")]
    with pytest.raises(ValueError):
        list(read_text(f, Rejects(), mode="lines"))


def test_read_inputs_dispatch_and_fail_fast(tmp_path, text_folder):
    j = write_lines(tmp_path / "x.jsonl", ['{"text": "from jsonl"}'])
    recs = list(read_inputs([j, text_folder], Rejects()))
    assert recs[0].text == "from jsonl" and recs[1].source == "a.txt"
    assert [p.name for p in input_files([j, text_folder])] == ["x.jsonl", "a.txt", "bad.txt", "b.txt"]
    (tmp_path / "data.xml").write_text("<a/>\n")
    for bad, exc in [(tmp_path / "missing.jsonl", FileNotFoundError), (tmp_path / "data.xml", ValueError)]:
        gen = read_inputs([j, bad], Rejects())
        with pytest.raises(exc):
            next(gen)  # raises before yielding the valid file's record
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(ValueError):
        input_files([empty])
