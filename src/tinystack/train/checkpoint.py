"""Writing a trained model out as a model directory (weights, config, tokenizer, lineage).

The directory is assembled in a temporary sibling and renamed into place, so a
crash mid-save leaves the previous model directory intact and a reader never
sees a half-written one.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from tinystack.model.gpt import GPT
from tinystack.model.io import save_model


def save_model_dir(model: GPT, tokenizer: Any, out_dir: str | Path, lineage: dict[str, Any]) -> Path:
    """Write model + tokenizer + lineage to `out_dir`, replacing any previous directory atomically."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_model(model, tmp, eos_token_id=tokenizer.eos_token_id, lineage=lineage)
        tokenizer.save(tmp)
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out_dir.rename(old)
        tmp.rename(out_dir)  # the moment the new directory becomes visible
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
