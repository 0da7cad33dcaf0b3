"""Shared helpers for the data-layer tests (a plain module, not conftest.py, so its name
cannot clash with other test folders' conftests)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    """Write raw lines (str as UTF-8, bytes verbatim) joined by \\n."""
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode("utf-8") for line in lines) + b"\n")
    return path


def read_jsonl_dicts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


_VOCAB = ("river stone cloud market garden window signal paper engine forest harbor lantern "
          "meadow copper violin thunder pocket silver ladder orchard canvas bridge falcon marble "
          "pepper saddle tunnel velvet walnut anchor basket candle dragon ember feather glacier").split()


def distinct_text(seed: int, n_words: int = 12) -> str:
    """A deterministic sentence of random words: different seeds give texts far below any
    near-duplicate threshold, so only the duplicates a test plants are duplicates."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(n_words)).capitalize() + "."
