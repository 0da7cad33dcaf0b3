"""Shared helpers for the data-layer tests (a plain module, not conftest.py, so its name
cannot clash with other test folders' conftests)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    """Write raw lines (str as UTF-8, bytes verbatim) joined by \\n."""
    path.write_bytes(b"\n".join(l if isinstance(l, bytes) else l.encode("utf-8") for l in lines) + b"\n")
    return path


def read_jsonl_dicts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
