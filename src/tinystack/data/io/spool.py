"""A temporary on-disk record buffer, for steps that must see everything before
deciding anything (near dedup, the source split) without holding it in memory.

Records are appended as JSON lines (with their ``origin``, which `Record` does not
serialise) and read back in order, as many times as needed. The file lives in the
system temp dir and disappears on `close` (or garbage collection).
"""
from __future__ import annotations

import json
import tempfile
from typing import Iterator

from tinystack.data.io.records import Record


class Spool:
    def __init__(self) -> None:
        self._f = tempfile.TemporaryFile("w+b")
        self.n = 0

    def append(self, r: Record) -> None:
        line = json.dumps([r.to_dict(), list(r.origin) if r.origin else None], ensure_ascii=False)
        self._f.write(line.encode("utf-8") + b"\n")
        self.n += 1

    def __iter__(self) -> Iterator[Record]:
        self._f.flush()
        self._f.seek(0)
        for line in self._f:
            d, origin = json.loads(line)
            yield Record.from_dict(d, origin=tuple(origin) if origin else None)
        self._f.seek(0, 2)  # back to the end, so append keeps working

    def texts(self, wanted: set[int]) -> dict[int, str]:
        """{index: text} for the wanted indices (one pass; other lines are not parsed)."""
        out: dict[int, str] = {}
        if not wanted:
            return out
        self._f.flush()
        self._f.seek(0)
        for i, line in enumerate(self._f):
            if i in wanted:
                out[i] = json.loads(line)[0]["text"]
        self._f.seek(0, 2)
        return out

    def close(self) -> None:
        self._f.close()

    def __len__(self) -> int:
        return self.n
