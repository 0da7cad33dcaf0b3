"""`prepare`: inputs -> read -> normalize -> length filter -> exact dedup -> split -> files.

Output directory layout:

    out_dir/train.jsonl, val.jsonl, test.jsonl   the splits (records, input order kept)
    out_dir/rejected.jsonl                       only if something was rejected
    out_dir/manifest.json                        counts, hashes, parameters (written last)

Every file is written atomically. The old manifest is deleted *first* and the new one
written *last*, so it acts as a commit marker: if a run dies halfway, the directory
has no manifest (or, if the files were edited later, `verify_data_dir` reports a hash
mismatch) and later stages know the data is not ready.

Accounting: each step's ``in == kept + sum(dropped)`` and each step's ``kept`` equals
the next step's ``in``; this is checked before anything is written, so the manifest can
always explain where every input line went (reader rejects are the "read" step's
drops and are itemised in rejected.jsonl).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from tinystack.atomic import write_json
from tinystack.data.clean import LengthFilter, Normalize
from tinystack.data.dedup import ExactDedup
from tinystack.data.manifest import FORMAT, MANIFEST, combine_hashes, sha256_file
from tinystack.data.readers import TextMode, input_files, read_inputs
from tinystack.data.records import Record, write_jsonl
from tinystack.data.rejects import Rejects
from tinystack.data.split import SPLITS, Splitter
from tinystack.data.steps import Step, StepStats


def _read_step(stream: Iterable[Record], rejects: Rejects, stats: StepStats) -> Iterator[Record]:
    """Count what the readers yield; when they finish, their rejects become 'read' drops."""
    for r in stream:
        stats.kept += 1
        yield r
    stats.dropped.update(rejects.counts)  # snapshot now: the split may add its own rejects later
    stats.n_in = stats.kept + stats.dropped_total


def _with_progress(stream: Iterable[Record], enabled: bool) -> Iterator[Record]:
    """Show a live record counter on stderr (rich) when enabled; otherwise pass through."""
    if not enabled:
        yield from stream
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("data: {task.completed} records kept"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task("prepare", total=None)
        for i, r in enumerate(stream, start=1):
            if i % 1000 == 0:
                bar.update(task, completed=i)
            yield r


def _check_accounting(chain: list[StepStats]) -> None:
    for s in chain:
        s.check()
    for a, b in zip(chain, chain[1:]):
        if a.kept != b.n_in:
            raise AssertionError(f"step {a.name} kept {a.kept} but step {b.name} received {b.n_in}")


def prepare(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    min_chars: int = 32,
    max_chars: int = 20_000,
    split_by: str = "source",
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    val_from: str = "",
    test_from: str = "",
    progress: bool = False,
    text_mode: TextMode = "blocks",
) -> dict[str, Any]:
    """Run the data pipeline on `inputs` and write `out_dir`; return the manifest dict.

    `inputs`: JSONL files, .txt files, folders of .txt files (see `read_inputs`).
    Arguments are validated before any input is read (ValueError / FileNotFoundError).
    Empty splits are allowed but listed under ``manifest["warnings"]``.
    """
    if not inputs:
        raise ValueError("prepare: no inputs given")
    out_dir = Path(out_dir)
    rejects = Rejects()
    steps: list[Step] = [Normalize(), LengthFilter(min_chars, max_chars), ExactDedup()]
    splitter = Splitter(
        split_by, val_fraction=val_fraction, test_fraction=test_fraction,
        val_from=val_from, test_from=test_from, rejects=rejects,
    )
    files = input_files(inputs)  # raises on a missing/unsupported input before work starts
    input_info = [{"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in files]

    read_stats = StepStats("read")
    stream: Iterable[Record] = _read_step(read_inputs(inputs, rejects, text_mode=text_mode), rejects, read_stats)
    for step in steps:
        stream = step(stream)
    splits = splitter(_with_progress(stream, progress))
    chain = [read_stats, *(s.stats for s in steps), splitter.stats]
    _check_accounting(chain)
    split_sources = {k: sorted({r.source for r in splits[k]}) for k in SPLITS}
    if split_by == "source":  # the defining property of a source split; cheap to assert
        seen: Counter[str] = Counter(s for k in SPLITS for s in split_sources[k])
        if any(n > 1 for n in seen.values()):
            raise AssertionError("a source was assigned to more than one split")

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)  # uncommitted until the new one is written
    files_out: dict[str, dict[str, Any]] = {}
    for k in SPLITS:
        path = out_dir / f"{k}.jsonl"
        write_jsonl(path, splits[k])
        files_out[path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    rejected_path = out_dir / "rejected.jsonl"
    if len(rejects):
        rejects.write(rejected_path)
    else:
        rejected_path.unlink(missing_ok=True)  # a stale file from an earlier run would mislead

    dedup = steps[2].stats
    warnings = [f"{k} split is empty" for k in SPLITS if not splits[k]]
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "hash": combine_hashes({name: info["sha256"] for name, info in files_out.items()}),
        "splits": {
            k: {
                "records": len(splits[k]),
                "sources": len(split_sources[k]),
                "chars": sum(len(r.text) for r in splits[k]),
                "file": f"{k}.jsonl",
            }
            for k in SPLITS
        },
        "files": files_out,
        "steps": [s.to_dict() for s in chain],
        "dedup_rate": round(dedup.dropped_total / dedup.n_in, 6) if dedup.n_in else 0.0,
        "rejects": {
            "total": rejects.total,
            "by_reason": dict(sorted(rejects.counts.items())),
            "file": rejected_path.name if len(rejects) else None,
        },
        "inputs": input_info,
        "params": {
            "min_chars": min_chars, "max_chars": max_chars, "split_by": split_by,
            "val_fraction": val_fraction, "test_fraction": test_fraction,
            "val_from": val_from, "test_from": test_from, "text_mode": text_mode,
        },
        "records_in": read_stats.n_in,
        "records_out": sum(len(v) for v in splits.values()),
        "warnings": warnings,
    }
    write_json(out_dir / MANIFEST, manifest)
    return manifest
