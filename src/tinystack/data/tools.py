"""The single-purpose data commands as functions: normalize, filter, dedup, split.

Each reads inputs like `prepare` (any supported format, field mapping, rejects with
file/line/reason), runs one part of the chain, writes its outputs atomically
(``.parquet`` output paths write Parquet, anything else JSONL) plus
``rejected.jsonl`` when something was rejected, and returns a summary dict with
``steps`` (same shape as the manifest's) that `report.summary_table` renders.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from tinystack.atomic import write_json
from tinystack.config import DataConfig
from tinystack.data.dedup.near_duplicates import NearDupParams
from tinystack.data.dedup.near_step import NearDedup
from tinystack.data.dedup.ray_engine import RayNearDedup
from tinystack.data.filters.clean import Normalize
from tinystack.data.filters.quality import QualityParams
from tinystack.data.io.formats import IDENTITY, FieldMap, write_records
from tinystack.data.io.readers import read_inputs
from tinystack.data.io.records import Record
from tinystack.data.io.rejects import Rejects
from tinystack.data.io.spool import Spool
from tinystack.data.pipeline import prepare
from tinystack.data.steps import StepStats
from tinystack.progress import track


def _read(inputs: Sequence[str | Path], rejects: Rejects, fields: FieldMap, stats: StepStats,
          progress: bool) -> Iterator[Record]:
    for r in track(read_inputs(inputs, rejects, fields=fields), "read", progress):
        stats.kept += 1
        yield r
    stats.dropped.update(rejects.counts)
    stats.n_in = stats.kept + stats.dropped_total


def with_stable_ids(records: Iterable[Record]) -> Iterator[Record]:
    """Give a record without an ``id`` the id ``"{source}:{line}"`` (its input line, or its
    1-based position in the stream when it has no origin): stable across reruns."""
    for i, r in enumerate(records, start=1):
        if r.id is None:  # a new record (not `dataclasses.replace`: it costs as much as reading the line)
            pos = r.origin[1] if r.origin else i
            r = Record(r.text, r.source, r.label, r.timestamp, f"{r.source}:{pos}", r.extra, r.origin)
        yield r


def _finish(out_dir: Path, rejects: Rejects, chain: list[StepStats], t0: float, **extra: Any) -> dict[str, Any]:
    if len(rejects):
        rejects.write(out_dir / "rejected.jsonl")
    elapsed = time.perf_counter() - t0
    n_in = chain[0].n_in
    return {"steps": [s.to_dict() for s in chain], "records_in": n_in, "records_out": chain[-1].kept,
            "rejects": dict(rejects.counts), "seconds": round(elapsed, 3),
            "docs_per_s": round(n_in / elapsed, 1) if elapsed > 0 else None, **extra}


def normalize_files(inputs: Sequence[str | Path], out: str | Path, *, fields: FieldMap = IDENTITY,
                    progress: bool = False) -> dict[str, Any]:
    """Read and normalise (`clean.normalize_text`) every record; write them to `out`."""
    t0, rejects, read = time.perf_counter(), Rejects(), StepStats("read")
    step = Normalize()
    write_records(out, step(_read(inputs, rejects, fields, read, progress)))
    return _finish(Path(out).parent, rejects, [read, step.stats], t0)


def filter_files(inputs: Sequence[str | Path], out: str | Path, quality: QualityParams, *,
                 fields: FieldMap = IDENTITY, progress: bool = False) -> dict[str, Any]:
    """Normalise, then run the quality filters; write the kept records to `out`."""
    t0, rejects, read = time.perf_counter(), Rejects(), StepStats("read")
    steps = [Normalize(), *quality.steps()]
    stream: Iterable[Record] = _read(inputs, rejects, fields, read, progress)
    for s in steps:
        stream = s(stream)
    write_records(out, stream)
    return _finish(Path(out).parent, rejects, [read, *(s.stats for s in steps)], t0)


def dedup_files(inputs: Sequence[str | Path], out_dir: str | Path, params: NearDupParams = NearDupParams(), *,
                fields: FieldMap = IDENTITY, workers: int = 1, engine: str = "local", ray_address: str | None = None,
                fmt: str = "jsonl", progress: bool = False) -> dict[str, Any]:
    """Exact + near dedup. Writes ``out_dir/kept.<fmt>`` (survivors) and
    ``out_dir/duplicates.<fmt>`` (the removed records), both in input order, every
    record with its input ``id`` (or a stable one) and its ``cluster_id``; and
    ``out_dir/dedup.json`` (this summary). Texts are written as read: normalisation is
    only the comparison key."""
    t0, rejects, read = time.perf_counter(), Rejects(), StepStats("read")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    removed_path = out_dir / f"duplicates.{fmt}"
    spool = Spool()  # removed records wait on disk: there can be many
    if engine == "ray":
        step: Any = RayNearDedup(params, exact=True, address=ray_address, on_removed=spool.append)
    else:
        step = NearDedup(params, exact=True, workers=workers, on_removed=spool.append)
    try:
        write_records(out_dir / f"kept.{fmt}", step(with_stable_ids(_read(inputs, rejects, fields, read, progress))))
        write_records(removed_path, iter(spool))
    finally:
        spool.close()
    b, r = params.bands
    summary = _finish(out_dir, rejects, [read, step.stats], t0, threshold=params.threshold, bands=b, rows=r,
                      dedup_rate=round(step.stats.dropped_total / step.stats.n_in, 6) if step.stats.n_in else 0.0,
                      clusters=step.stats.extra.get("clusters", 0))
    write_json(out_dir / "dedup.json", summary)
    return summary


def split_files(inputs: Sequence[str | Path], out_dir: str | Path, config: DataConfig,
                progress: bool = False) -> dict[str, Any]:
    """Split (by source or time, [data]'s split keys) and remove cross-split near duplicates: `prepare` with
    normalisation only (no length/quality filter, no dedup)."""

    only_split = dataclasses.replace(config, min_chars=0, max_chars=0, quality=False, near_dedup=False)
    return prepare(inputs, out_dir, only_split, progress=progress)
