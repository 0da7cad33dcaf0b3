"""Field mapping, CSV and Parquet readers, and the JSONL / Parquet record writer.

**Field mapping** (`FieldMap`): inputs from other schemas name their fields
differently (``content``, ``url``, ``created_at``...). A `FieldMap` renames them to
the unified record keys *before* validation, so every reader reports the same
reject reasons: ``FieldMap(text="content", source="url")``. The original key is
removed; other keys stay as extras.

**CSV** (`read_csv`): header row required; every row is a dict of strings (an empty
cell is absent). ``line`` in a reject is the row's first physical line. The file is
decoded with ``surrogateescape`` so a row with invalid UTF-8 is rejected on its own
(``invalid_utf8``) instead of failing the whole file.

**Parquet** (`read_parquet`): read in record batches of `PARQUET_BATCH` rows
(streaming; memory independent of file size); ``line`` is the 1-based row number.

**Writers** (`write_records`): ``.jsonl`` -> `records.write_jsonl`; ``.parquet`` ->
string columns text, source, label (JSON), timestamp, id (JSON), extra (JSON object
of the remaining keys, e.g. ``cluster_id``), written in row groups as records
stream in, with schema metadata ``tinystack.format=records/1`` so `read_parquet`
decodes them back exactly. Both are atomic (`tinystack.atomic`).
"""
from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from tinystack.atomic import atomic_open
from tinystack.data.io.records import Record, RecordError, write_jsonl
from tinystack.data.io.rejects import Rejects

PARQUET_BATCH = 8192
CSV_SUFFIXES = (".csv", ".tsv")
PARQUET_SUFFIXES = (".parquet",)
META_KEY, META_VALUE = b"tinystack.format", b"records/1"  # marks files `write_parquet` wrote


@dataclass(frozen=True)
class FieldMap:
    """Input field name for each record key (defaults: the unified names)."""

    text: str = "text"
    source: str = "source"
    label: str = "label"
    timestamp: str = "timestamp"
    id: str = "id"

    def apply(self, obj: Any) -> Any:
        """A copy of `obj` with mapped fields renamed; non-dicts pass through (and get rejected)."""
        if not isinstance(obj, dict) or self == IDENTITY:
            return obj
        out = dict(obj)
        for key in ("text", "source", "label", "timestamp", "id"):
            src = getattr(self, key)
            if src != key:
                out.pop(key, None)  # the mapped field wins over a same-named one
                if src in obj:
                    out[key] = out.pop(src)
        return out


IDENTITY = FieldMap()


def _build(obj: Any, path: Path, line: int, raw: str, rejects: Rejects, fields: FieldMap,
           default_source: str) -> Record | None:
    try:
        return Record.from_dict(fields.apply(obj), default_source=default_source, origin=(str(path), line))
    except RecordError as e:
        rejects.add(path, line, e.reason, raw, str(e))
        return None


def read_csv(path: str | Path, rejects: Rejects, *, fields: FieldMap = IDENTITY) -> Iterator[Record]:
    """Yield one record per CSV row (tab-separated for .tsv)."""
    path = Path(path)
    csv.field_size_limit(sys.maxsize)  # a document is one (possibly huge) cell
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ",")
        _header = reader.fieldnames  # the property reads the header row now, so line_num points past it
        start = reader.line_num + 1
        for row in reader:
            line, start = start, reader.line_num + 1
            raw = json.dumps(row, ensure_ascii=False, default=str)
            try:
                raw.encode("utf-8")
            except UnicodeEncodeError as e:
                rejects.add(path, line, "invalid_utf8", raw.encode("utf-8", "surrogateescape"), str(e))
                continue
            if None in row:  # more cells than header columns
                rejects.add(path, line, "bad_row", raw, "row has more cells than the header")
                continue
            obj = {k: v for k, v in row.items() if v not in ("", None)}
            rec = _build(obj, path, line, raw, rejects, fields, path.name)
            if rec is not None:
                yield rec


def read_parquet(path: str | Path, rejects: Rejects, *, fields: FieldMap = IDENTITY) -> Iterator[Record]:
    """Yield one record per Parquet row, streaming record batches."""
    # deferred: pyarrow only for Parquet files (a heavy import most runs never need)
    import pyarrow.parquet as pq

    path = Path(path)
    pf = pq.ParquetFile(path)
    ours = (pf.schema_arrow.metadata or {}).get(META_KEY) == META_VALUE
    line = 0
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH):
        for row in batch.to_pylist():
            line += 1
            obj = _from_parquet_row(row) if ours else {k: v for k, v in row.items() if v is not None}
            rec = _build(obj, path, line, json.dumps(row, ensure_ascii=False, default=str), rejects, fields, path.name)
            if rec is not None:
                yield rec


def _parquet_row(r: Record) -> dict[str, Any]:
    return {"text": r.text, "source": r.source, "label": json.dumps(r.label, ensure_ascii=False),
            "timestamp": r.timestamp, "id": None if r.id is None else json.dumps(r.id),
            "extra": json.dumps(r.extra, ensure_ascii=False, sort_keys=True)}


def _from_parquet_row(row: dict[str, Any]) -> dict[str, Any]:
    """Invert `_parquet_row` (files written by `write_parquet` round-trip exactly)."""
    d: dict[str, Any] = json.loads(row.get("extra") or "{}")
    d.update(text=row["text"], source=row["source"], label=json.loads(row["label"]) if row.get("label") else None)
    if row.get("timestamp") is not None:
        d["timestamp"] = row["timestamp"]
    if row.get("id") is not None:
        d["id"] = json.loads(row["id"])
    return d


def write_parquet(path: str | Path, records: Iterable[Record]) -> int:
    """Atomically write records to Parquet in row groups of `PARQUET_BATCH`; return the count."""
    # deferred: pyarrow only for Parquet files (a heavy import most runs never need)
    import pyarrow as pa

    # deferred: pyarrow only for Parquet files (a heavy import most runs never need)
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string()), ("source", pa.string()), ("label", pa.string()),
                        ("timestamp", pa.string()), ("id", pa.string()), ("extra", pa.string())],
                       metadata={META_KEY: META_VALUE})
    n = 0
    with atomic_open(path, "wb") as f, pq.ParquetWriter(f, schema) as w:
        buf: list[dict[str, Any]] = []
        for r in records:
            buf.append(_parquet_row(r))
            if len(buf) == PARQUET_BATCH:
                w.write_table(pa.Table.from_pylist(buf, schema))
                n, buf = n + len(buf), []
        if buf or n == 0:
            w.write_table(pa.Table.from_pylist(buf, schema))
            n += len(buf)
    return n


def write_records(path: str | Path, records: Iterable[Record]) -> int:
    """Write by suffix: .parquet -> Parquet, anything else -> JSONL."""
    if Path(path).suffix in PARQUET_SUFFIXES:
        return write_parquet(path, records)
    return write_jsonl(path, records)
