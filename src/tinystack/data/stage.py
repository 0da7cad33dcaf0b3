"""The data layer's pipeline stages: the built-in corpus, and inputs -> prepared splits.

Called by `tinystack run` and by `tinystack data corpus|prepare`, so a stage run by hand gives what the pipeline gives.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tinystack.config import Config
from tinystack.progress import console


def stage_corpus(cfg: Config, out: Path) -> dict[str, Any]:
    from tinystack.data import build_corpus

    stats = build_corpus(out, max_docs=cfg.data.corpus_max_docs)
    console.print(f"corpus: {stats['records']:,} docstrings from {stats['sources']:,} modules -> {out}")
    return stats


def stage_data(cfg: Config, inputs: list[Path], out_dir: Path, progress: bool = True) -> dict[str, Any]:
    from tinystack.data import prepare
    from tinystack.data.report import summary_table

    t0 = time.perf_counter()
    manifest = prepare(inputs, out_dir, cfg.data, progress=progress)
    rate = manifest["records_in"] / max(time.perf_counter() - t0, 1e-9)  # not in the manifest: it stays deterministic
    console.print(summary_table({**manifest, "docs_per_s": rate}, f"data -> {out_dir}"))
    splits = manifest["splits"]
    console.print("splits: " + ", ".join(f"{k} {v['records']:,} records / {v['sources']:,} sources"
                                          for k, v in splits.items()))
    return {"hash": manifest["hash"], "splits": {k: v["records"] for k, v in splits.items()}}
