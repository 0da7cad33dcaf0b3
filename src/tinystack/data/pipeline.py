"""`prepare`: inputs -> read -> normalize -> length -> quality filters -> exact dedup
-> near dedup -> split -> leakage removal -> files.

Output directory layout:

    out_dir/train.jsonl, val.jsonl, test.jsonl   the splits (records, input order kept,
                                                 each with its near-dedup ``cluster_id``)
    out_dir/rejected.jsonl                       only if something was rejected
    out_dir/manifest.json                        counts, hashes, parameters (written last)

Streaming: records flow through generators; the steps that must see everything
(near dedup, the source split) park records in on-disk spools, so memory holds the
signature index and per-source counts, not the corpus. val/test are filtered for
leakage against an index of train (then train + val) built from the written files
(`leakage.LeakageCheck`, which reuses the near-dedup signatures when it can).

Every file is written atomically. The old manifest is deleted *first* and the new one
written *last*, so it acts as a commit marker: if a run dies halfway, the directory
has no manifest (or, if the files were edited later, `verify_data_dir` reports a hash
mismatch) and later stages know the data is not ready.

Accounting: each step's ``in == kept + sum(dropped)`` and each step's ``kept`` equals
the next step's ``in``; this is checked before the manifest is written, so it can
always explain where every input line went (reader rejects are the "read" step's
drops and are itemised in rejected.jsonl).
"""
from __future__ import annotations

from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from tinystack.atomic import file_sha256, write_json
from tinystack.config import DataConfig
from tinystack.data.dedup.exact import ExactDedup
from tinystack.data.dedup.near_step import NearDedup
from tinystack.data.filters.clean import LengthFilter, Normalize
from tinystack.data.io.formats import IDENTITY
from tinystack.data.io.manifest import FORMAT, MANIFEST, combine_hashes
from tinystack.data.io.readers import TextMode, input_files, read_inputs
from tinystack.data.io.records import Record, write_jsonl
from tinystack.data.io.rejects import Rejects
from tinystack.data.io.spool import Spool
from tinystack.data.options import field_map, near_dup_params, quality_params
from tinystack.data.split.leakage import LeakageCheck
from tinystack.data.split.splitter import SPLITS, StreamSplitter
from tinystack.data.steps import StepStats
from tinystack.progress import track


def _read_step(stream: Iterable[Record], rejects: Rejects, stats: StepStats) -> Iterator[Record]:
    """Count what the readers yield; when they finish, their rejects become 'read' drops."""
    for r in stream:
        stats.kept += 1
        yield r
    stats.dropped.update(rejects.counts)  # snapshot now: the split may add its own rejects later
    stats.n_in = stats.kept + stats.dropped_total


def _check_accounting(chain: list[StepStats]) -> None:
    for s in chain:
        s.check()
    for a, b in zip(chain, chain[1:]):
        if a.kept != b.n_in:
            raise AssertionError(f"step {a.name} kept {a.kept} but step {b.name} received {b.n_in}")


def _split_info(records: Iterable[Record], info: dict[str, Any]) -> Iterator[Record]:
    """Pass records through while counting records, chars and distinct sources."""
    sources: set[str] = set()
    info.update(records=0, chars=0)
    for r in records:
        info["records"] += 1
        info["chars"] += len(r.text)
        sources.add(r.source)
        yield r
    info["sources"] = len(sources)
    info["_sources"] = sources


def prepare(inputs: Sequence[str | Path], out_dir: str | Path, config: DataConfig | None = None, *,
            progress: bool = False, text_mode: TextMode = "blocks") -> dict[str, Any]:
    """Run the data pipeline on `inputs` with the [data] section (`config`, whole; its defaults when None) and
    write `out_dir`; return the manifest dict.

    `inputs`: JSONL, CSV/TSV, Parquet, .txt files, folders of .txt (see `read_inputs`); the `*_field` keys map
    other schemas' field names. `quality=false` skips the quality filters, `near_dedup=false` the MinHash step,
    `leakage_threshold=0` the cross-split check; `workers` > 1 computes signatures in a process pool, and
    ``engine="ray"`` runs near dedup on Ray Data (`ray_address`). Arguments are validated before any input is
    read (ValueError / FileNotFoundError). Empty splits are allowed but listed under ``manifest["warnings"]``.
    """
    d = config or DataConfig()
    min_chars, max_chars, split_by, workers, engine = d.min_chars, d.max_chars, d.split_by, d.workers, d.engine
    val_fraction, test_fraction, val_from, test_from = d.val_fraction, d.test_fraction, d.val_from, d.test_from
    fields, quality = field_map(d), quality_params(d)
    near_dedup = near_dup_params(d) if d.near_dedup else None
    leakage = near_dup_params(d, d.leakage_threshold) if d.leakage_threshold > 0 else None
    if not inputs:
        raise ValueError("prepare: no inputs given")
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out_dir = Path(out_dir)
    rejects = Rejects()
    # the dedup steps by name, not by position in the chain: the leakage check reuses the near step's signatures
    # and dedup_rate reads both, whatever steps come before or after them
    exact: Any = ExactDedup()
    near: Any = None
    if near_dedup is not None:
        if engine == "ray":
            from tinystack.data.dedup.ray_engine import RayNearDedup

            near = RayNearDedup(near_dedup, exact=False, address=d.ray_address)
        else:
            near = NearDedup(near_dedup, exact=False, workers=workers)
    steps: list[Any] = [Normalize(), LengthFilter(min_chars, max_chars), *(quality.steps() if quality else []),
                        exact, *([near] if near is not None else [])]
    splitter = StreamSplitter(split_by, val_fraction=val_fraction, test_fraction=test_fraction,
                              val_from=val_from, test_from=test_from, rejects=rejects)
    files = input_files(inputs)  # raises on a missing/unsupported input before work starts
    input_info = [{"path": str(f), "bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in files]

    read_stats = StepStats("read")
    stream: Iterable[Record] = _read_step(read_inputs(inputs, rejects, text_mode=text_mode, fields=fields),
                                          rejects, read_stats)
    stream = track(stream, "read", progress)
    for step in steps:
        stream = step(stream)
    spools = {k: Spool() for k in SPLITS}
    cluster_ids = {k: array("q") for k in SPLITS}  # per split, each record's near-dedup cluster_id
    try:
        for name, r in splitter.route(track(stream, "kept", progress)):
            spools[name].append(r)
            cluster_ids[name].append(r.extra.get("cluster_id", -1))

        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / MANIFEST).unlink(missing_ok=True)  # uncommitted until the new one is written
        leak = StepStats("leakage", extra={"leaked": {"val": 0, "test": 0},
                                           "threshold": leakage.threshold if leakage else None})
        check = LeakageCheck(leakage, leak) if leakage is not None else None
        if check is not None and near is not None and near.signatures is not None \
                and leakage.minhash == near_dedup.minhash:
            check.adopt(*near.take_signatures(), {k: np.frombuffer(v, dtype=np.int64) for k, v in cluster_ids.items()})
        del cluster_ids
        info: dict[str, dict[str, Any]] = {k: {} for k in SPLITS}
        files_out: dict[str, dict[str, Any]] = {}
        for k in SPLITS:
            path = out_dir / f"{k}.jsonl"
            recs: Iterable[Record] = iter(spools[k])
            if k == "train" or check is None:  # train is never filtered for leakage: only val/test are
                leak.n_in += len(spools[k])
                leak.kept += len(spools[k])
            else:
                recs = check.filter(k, recs)
            write_jsonl(path, _split_info(recs, info[k]))
            files_out[path.name] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
            if check is not None and k != "test":
                check.index(k, path)
    finally:
        for s in spools.values():
            s.close()
    chain = [read_stats, *(s.stats for s in steps), splitter.stats, leak]
    _check_accounting(chain)
    split_sources = {k: info[k].pop("_sources") for k in SPLITS}
    if split_by == "source":  # the defining property of a source split; cheap to assert
        seen: Counter[str] = Counter(s for k in SPLITS for s in split_sources[k])
        if any(n > 1 for n in seen.values()):
            raise AssertionError("a source was assigned to more than one split")

    rejected_path = out_dir / "rejected.jsonl"
    if len(rejects):
        rejects.write(rejected_path)
    else:
        rejected_path.unlink(missing_ok=True)  # a stale file from an earlier run would mislead

    dedup_in = exact.stats.n_in
    dedup_dropped = sum(s.stats.dropped_total for s in (exact, near) if s is not None)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "hash": combine_hashes({name: f["sha256"] for name, f in files_out.items()}),
        "splits": {k: {**info[k], "file": f"{k}.jsonl"} for k in SPLITS},
        "files": files_out,
        "steps": [s.to_dict() for s in chain],
        "dedup_rate": round(dedup_dropped / dedup_in, 6) if dedup_in else 0.0,
        "leakage": leak.dropped_total,
        "rejects": {"total": rejects.total, "by_reason": dict(sorted(rejects.counts.items())),
                    "file": rejected_path.name if len(rejects) else None},
        "inputs": input_info,
        "params": {
            "min_chars": min_chars, "max_chars": max_chars, "split_by": split_by,
            "val_fraction": val_fraction, "test_fraction": test_fraction,
            "val_from": val_from, "test_from": test_from, "text_mode": text_mode,
            "fields": vars(fields).copy() if fields != IDENTITY else None,
            "quality": _params(quality), "near_dedup": _params(near_dedup), "leakage": _params(leakage),
            "workers": workers, "engine": engine,
        },
        "records_in": read_stats.n_in,
        "records_out": sum(info[k]["records"] for k in SPLITS),
        "warnings": [f"{k} split is empty" for k in SPLITS if not info[k]["records"]],
    }
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def _params(p: Any) -> dict[str, Any] | None:
    import dataclasses

    return None if p is None else {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(p).items()}
