"""The unified record schema every reader produces and every later step consumes.

One record is one training document, serialised as one JSON object per line:

    {"text": str, "source": str, "label": any JSON | null,
     "timestamp": ISO-8601 str (optional), "id": str | int (optional), ...extra keys}

Contract (enforced by `Record.from_dict`, which raises `RecordError`):

* ``text``      required, a ``str`` with at least one non-whitespace character.
* ``source``    a non-empty ``str``. If absent (or null) the caller's ``default_source`` is
                used; `from_dict` defaults to ``"unknown"``, the JSONL reader passes the
                input file's name, so a record is always attributable to *something*.
                The source is the unit of the train/val/test split, so it matters.
* ``label``     any JSON value (usually a str) or null; not interpreted by this layer.
* ``timestamp`` optional; if present it must parse with `datetime.fromisoformat`
                (``Z`` accepted). It is kept verbatim so the file round-trips byte for
                byte; `Record.when()` gives the parsed, UTC-aware datetime (a naive
                timestamp is taken to be UTC).
* ``id``        optional ``str`` or ``int``.
* any other key is kept in ``Record.extra`` and written back unchanged.

`write_jsonl` is the one writer: atomic (see `tinystack.atomic`), UTF-8, one record per
line, so a crash mid-write leaves the previous file intact.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from tinystack.atomic import atomic_open

CORE_KEYS = ("text", "label", "source", "timestamp", "id")
DEFAULT_SOURCE = "unknown"


class RecordError(ValueError):
    """A dict is not a valid record. `reason` is a short machine code (the reject reason),
    `str(err)` a human sentence."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_timestamp(value: str) -> datetime:
    """ISO 8601 string -> timezone-aware datetime (naive means UTC). Raises ValueError."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"timestamp must be a non-empty ISO 8601 string, got {value!r}")
    dt = datetime.fromisoformat(value.strip())  # 3.11 accepts "Z" and most of ISO 8601
    # Why UTC for naive: comparing naive with aware datetimes raises, and mixing them
    # in one input is common; one fixed rule keeps the time split well defined.
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt


@dataclass
class Record:
    """One document. `origin` is (file, line) provenance for reject reports; it is
    deliberately not serialised and not part of equality."""

    text: str
    source: str = DEFAULT_SOURCE
    label: Any = None
    timestamp: str | None = None
    id: str | int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    origin: tuple[str, int] | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Core keys first (text, label, source, then timestamp/id if set), then extras."""
        d: dict[str, Any] = {"text": self.text, "label": self.label, "source": self.source}
        if self.timestamp is not None:
            d["timestamp"] = self.timestamp
        if self.id is not None:
            d["id"] = self.id
        for k, v in self.extra.items():
            d.setdefault(k, v)  # an extra can never shadow a core key
        return d

    def when(self) -> datetime | None:
        """The parsed timestamp (UTC-aware), or None if the record has none."""
        return None if self.timestamp is None else parse_timestamp(self.timestamp)

    @classmethod
    def from_dict(
        cls,
        d: Any,
        *,
        default_source: str = DEFAULT_SOURCE,
        origin: tuple[str, int] | None = None,
    ) -> Record:
        """Validate a decoded JSON value and build a Record; raise RecordError(reason, msg).

        Reasons: not_object, missing_text, text_not_string, empty_text, bad_source,
        bad_timestamp, bad_id.
        """
        if not isinstance(d, dict):
            raise RecordError("not_object", f"expected a JSON object, got {type(d).__name__}")
        if "text" not in d or d["text"] is None:
            raise RecordError("missing_text", "record has no 'text' field")
        text = d["text"]
        if not isinstance(text, str):
            raise RecordError("text_not_string", f"'text' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise RecordError("empty_text", "'text' is empty or whitespace only")
        source = d.get("source")
        if source is None:
            source = default_source
        if not isinstance(source, str) or not source:
            raise RecordError("bad_source", f"'source' must be a non-empty string, got {source!r}")
        ts = d.get("timestamp")
        if ts is not None:
            try:
                parse_timestamp(ts)
            except (ValueError, TypeError) as e:
                raise RecordError("bad_timestamp", f"'timestamp' is not ISO 8601: {e}") from None
        rid = d.get("id")
        if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
            raise RecordError("bad_id", f"'id' must be a string or integer, got {rid!r}")
        extra = {k: v for k, v in d.items() if k not in CORE_KEYS}
        return cls(text=text, source=source, label=d.get("label"), timestamp=ts, id=rid, extra=extra, origin=origin)


# One encoder for every line: `json.dumps(..., ensure_ascii=False)` builds a new encoder
# per call, a large part of the cost of encoding a short document.
_encode = json.JSONEncoder(ensure_ascii=False).encode


def dumps(record: Record) -> str:
    """One JSONL line (without newline). ensure_ascii=False: UTF-8 files stay readable."""
    return _encode(record.to_dict())


def write_jsonl(path: str | Path, records: Iterable[Record]) -> int:
    """Atomically write records as JSONL; return how many were written.

    If `records` raises midway, the temp file is discarded and any existing file at
    `path` is left exactly as it was.
    """
    n = 0
    with atomic_open(path, "w") as f:
        for r in records:
            f.write(dumps(r))
            f.write("\n")
            n += 1
    return n
