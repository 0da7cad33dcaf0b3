"""The reject sink: every input the pipeline could not turn into a record lands here.

Nothing is silently lost. A reader that meets a malformed line calls
``rejects.add(file, line, reason, raw)`` and moves on to the next line; the sink
counts per reason and keeps the entry, and `write` saves them (atomically) as
``rejected.jsonl``, one ``{"file", "line", "reason", "detail", "raw"}`` object per line:

* ``file``   the input path as given to the reader,
* ``line``   1-based line number where the bad input starts (for text blocks: the
             first offending line),
* ``reason`` a short code (invalid_json, not_object, invalid_utf8, missing_text, ...),
* ``detail`` the human explanation,
* ``raw``    the offending input, decoded with ``backslashreplace`` if it was not UTF-8,
             so the exact bytes can be recovered.

Entries are held in memory: rejects are expected to be a small fraction of the input,
and holding them lets the file be written in one atomic step.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tinystack.atomic import atomic_open


class Rejects:
    """Counts and keeps rejected inputs. `counts[reason]` is the number per reason."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.entries: list[dict[str, Any]] = []

    def add(self, file: str | Path, line: int, reason: str, raw: str | bytes, detail: str = "") -> None:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", errors="backslashreplace")
        self.counts[reason] += 1
        self.entries.append({"file": str(file), "line": int(line), "reason": reason, "detail": detail, "raw": raw})

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __len__(self) -> int:
        return len(self.entries)

    def write(self, path: str | Path) -> int:
        """Atomically write all entries as JSONL; return how many."""
        with atomic_open(path, "w") as f:
            for e in self.entries:
                f.write(json.dumps(e, ensure_ascii=False))
                f.write("\n")
        return len(self.entries)
