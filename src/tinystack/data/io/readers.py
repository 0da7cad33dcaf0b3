"""Readers: input files -> a stream of validated `Record`s (+ rejects).

Every reader is a generator that yields `Record`s and hands anything it cannot parse
to a `Rejects` sink with the file, the 1-based line number and a reason, then carries
on: one bad line never kills a file, and nothing is dropped without a trace.

* `read_jsonl(path, rejects)`: one JSON object per line. The file is read as bytes and
  each line is decoded on its own, so invalid UTF-8 rejects that line only. Blank lines
  carry no data and are skipped. A record without ``source`` gets the file's name.
* `read_text(path, rejects, mode)`: a ``.txt`` file or a folder of them (recursive,
  sorted, so the order is deterministic). ``mode="blocks"``: one document per
  blank-line-separated block; ``mode="file"``: one document per file. ``source`` is the
  path relative to the folder (the file name for a single file), ``label`` is None.
* `read_inputs(paths, rejects, fields=...)`: dispatch on each path: folder -> text
  folder, ``.jsonl``/``.ndjson`` -> JSONL, ``.txt`` -> text, ``.csv``/``.tsv`` and
  ``.parquet`` -> `formats.read_csv` / `read_parquet`; anything else is an error
  raised before any record is read (fail fast, not halfway through a run).
  `fields` (a `formats.FieldMap`) renames input fields to the record keys.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Literal, Sequence

from tinystack.data.io.formats import CSV_SUFFIXES, IDENTITY, PARQUET_SUFFIXES, FieldMap, read_csv, read_parquet
from tinystack.data.io.records import Record, RecordError
from tinystack.data.io.rejects import Rejects

JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_SUFFIXES = (".txt",)
TextMode = Literal["blocks", "file"]


def _decode(raw: bytes, first: bool) -> str:
    # utf-8-sig on the first line only: a BOM there is an editor artefact, elsewhere it is data.
    return raw.decode("utf-8-sig" if first else "utf-8")


def read_jsonl(path: str | Path, rejects: Rejects, *, default_source: str | None = None,
               fields: FieldMap | None = None) -> Iterator[Record]:
    """Yield the valid records of a JSONL file; send every bad line to `rejects`.

    Reject reasons: invalid_utf8, invalid_json, invalid_unicode (a lone surrogate
    escape such as ``"\\ud800"``, which cannot be written back as UTF-8), and the
    `RecordError` reasons (not_object, missing_text, text_not_string, empty_text,
    bad_source, bad_timestamp, bad_id). `fields` renames input keys first.
    """
    path = Path(path)
    fallback, name = default_source or path.name, str(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            if not raw or raw.isspace():  # blank (no copy, unlike raw.strip())
                continue
            try:
                line = _decode(raw, lineno == 1)
            except UnicodeDecodeError as e:
                rejects.add(path, lineno, "invalid_utf8", raw, str(e))
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                rejects.add(path, lineno, "invalid_json", line, str(e))
                continue
            # cheap pre-check on the bytes (JSON escapes are ASCII: "\\u" + 4 hex digits of
            # either case); only then pay for the full test.
            if b"\\ud" in raw or b"\\uD" in raw:
                try:
                    json.dumps(obj, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError as e:
                    rejects.add(path, lineno, "invalid_unicode", line, str(e))
                    continue
            if fields is not None:
                obj = fields.apply(obj)
            try:
                yield Record.from_dict(obj, default_source=fallback, origin=(name, lineno))
            except RecordError as e:
                rejects.add(path, lineno, e.reason, line, str(e))


def _text_files(path: Path) -> list[tuple[Path, str]]:
    """(file, source) pairs for a .txt file or a folder of them, in sorted order."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        return [(p, p.relative_to(path).as_posix()) for p in files]
    return [(path, path.name)]


def _blocks(data: bytes) -> Iterator[tuple[int, list[bytes]]]:
    """Split bytes into (first_line_number, lines) blocks separated by blank lines."""
    start, block = 0, []
    for i, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            if not block:
                start = i
            block.append(line)
        elif block:
            yield start, block
            block = []
    if block:
        yield start, block


def read_text(path: str | Path, rejects: Rejects, mode: TextMode = "blocks") -> Iterator[Record]:
    """Yield one record per block (``mode="blocks"``) or per file (``mode="file"``).

    A block or file containing invalid UTF-8 is rejected whole (reason invalid_utf8,
    line = first bad line): dropping just the bad line would silently change the
    document. In file mode a whitespace-only file is rejected as empty_text.
    """
    if mode not in ("blocks", "file"):
        raise ValueError(f"read_text: mode must be 'blocks' or 'file', got {mode!r}")
    path = Path(path)
    for file, source in _text_files(path):
        data = file.read_bytes()
        if mode == "file":
            try:
                text = data.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                bad = data[: e.start].count(b"\n") + 1
                rejects.add(file, bad, "invalid_utf8", data, str(e))
                continue
            if not text.strip():
                rejects.add(file, 1, "empty_text", text, "file is empty or whitespace only")
                continue
            yield Record(text=text, source=source, id=source, origin=(str(file), 1))
            continue
        for start, lines in _blocks(data):
            decoded: list[str] = []
            for offset, raw in enumerate(lines):
                try:
                    decoded.append(_decode(raw, start + offset == 1))
                except UnicodeDecodeError as e:
                    rejects.add(file, start + offset, "invalid_utf8", b"\n".join(lines), str(e))
                    break
            else:
                yield Record(text="\n".join(decoded), source=source, id=f"{source}:{start}", origin=(str(file), start))


def input_files(paths: Sequence[str | Path]) -> list[Path]:
    """The concrete files `read_inputs` will read, in reading order (used for hashing).

    Raises FileNotFoundError for a missing path and ValueError for an unsupported
    suffix or a folder without .txt files.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
        if p.is_dir():
            files = [f for f, _ in _text_files(p)]
            if not files:
                raise ValueError(f"input folder {p} contains no .txt files")
            out.extend(files)
        elif p.suffix in JSONL_SUFFIXES + TEXT_SUFFIXES + CSV_SUFFIXES + PARQUET_SUFFIXES:
            out.append(p)
        else:
            raise ValueError(f"input {p}: unsupported type (expected .jsonl, .ndjson, .txt, .csv, .tsv, "
                             ".parquet or a folder of .txt)")
    return out


def read_inputs(paths: Sequence[str | Path], rejects: Rejects, *, text_mode: TextMode = "blocks",
                fields: FieldMap = IDENTITY) -> Iterator[Record]:
    """Read every input in order and yield its records. Paths are validated up front.
    `fields` renames input fields (JSONL, CSV, Parquet) to the record keys."""
    input_files(paths)  # raises before anything is read
    for p in map(Path, paths):
        if p.is_dir() or p.suffix in TEXT_SUFFIXES:
            yield from read_text(p, rejects, mode=text_mode)
        elif p.suffix in CSV_SUFFIXES:
            yield from read_csv(p, rejects, fields=fields)
        elif p.suffix in PARQUET_SUFFIXES:
            yield from read_parquet(p, rejects, fields=fields)
        else:
            yield from read_jsonl(p, rejects, fields=fields)
