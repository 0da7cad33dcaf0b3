"""Train/val/test split: by source, or by time. Never random.

Why not a random per-record split: documents from one source (one module, one author,
one site) share vocabulary, boilerplate and near-duplicates, so a random split puts
near-copies of training text into validation and the measured loss is optimistic. We
want to measure generalisation to *unseen sources* (``split_by="source"``) or to *the
future* (``split_by="time"``), which is how a deployed model meets new data.

**By source** (`assign_sources`): every record of a source goes to exactly one split.
Sources are ordered by the SHA-256 of their name (stable across machines, Python
versions and runs, unlike `hash()`, which is salted per process; and unlike a seeded
RNG it needs no state). Walking that order, a source goes to test if it still fits
under ``test_fraction`` of all *records*, else to val if it fits under
``val_fraction``, else to train. Fractions are therefore of records, approximately,
from below; a source bigger than a split's budget is never forced into it, so one
huge source cannot swallow the validation set. Then, if there are >= 3 sources and a
fraction is > 0 but its split is still empty, the smallest source (ties: SHA-256
order) is moved there from train (or from val, if train has only one source), so
val and test are non-empty whenever there are >= 3 sources. A fraction of 0 means
that split stays empty. Caveat: the budget depends on the total, so adding sources
can move other sources; the assignment is a pure function of (source -> count).

**By time** (`split_by_time`): ``timestamp < val_from`` -> train,
``val_from <= timestamp < test_from`` -> val, ``timestamp >= test_from`` -> test.
Naive timestamps/cutoffs are UTC. A record without a timestamp cannot be placed: it
is dropped with reason ``missing_timestamp`` (and sent to the reject sink with its
file and line), so it is visible in the manifest and rejected.jsonl. If *no* record
has a timestamp the input is clearly not meant for a time split and that is an error.

Within a split, records keep their input order.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime
from typing import Iterable, Iterator

from tinystack.data.io.records import Record, dumps, parse_timestamp
from tinystack.data.io.rejects import Rejects
from tinystack.data.io.spool import Spool
from tinystack.data.steps import StepStats

SPLITS = ("train", "val", "test")


def source_key(source: str) -> str:
    """Hex SHA-256 of the source name: its position in the deterministic order."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Raise ValueError unless both are in [0, 1) and sum to < 1 (train must get something)."""
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction={val_fraction}, test_fraction={test_fraction}: each must be in [0, 1) and their sum < 1"
        )


def time_cutoffs(val_from: str, test_from: str) -> tuple[datetime, datetime]:
    """Parse and check the two ISO cutoffs; raise ValueError with the reason."""
    if not val_from or not test_from:
        raise ValueError("split_by='time' needs both val_from and test_from (ISO 8601 timestamps)")
    try:
        v, t = parse_timestamp(val_from), parse_timestamp(test_from)
    except ValueError as e:
        raise ValueError(f"bad time cutoff: {e}") from None
    if v > t:
        raise ValueError(f"val_from={val_from!r} is after test_from={test_from!r}")
    return v, t


def assign_sources(counts: dict[str, int], val_fraction: float, test_fraction: float) -> dict[str, str]:
    """Map each source to "train" | "val" | "test" given its record count (see module doc)."""
    check_fractions(val_fraction, test_fraction)
    order = sorted(counts, key=lambda s: (source_key(s), s))
    total = sum(counts.values())
    budget = {"test": test_fraction * total, "val": val_fraction * total}
    filled = {"test": 0, "val": 0}
    assign: dict[str, str] = {}
    for s in order:
        assign[s] = "train"
        for name in ("test", "val"):
            if filled[name] + counts[s] <= budget[name]:
                assign[s], filled[name] = name, filled[name] + counts[s]
                break
    if len(order) >= 3:
        rank = {s: i for i, s in enumerate(order)}
        for name, frac in (("test", test_fraction), ("val", val_fraction)):
            if frac <= 0 or name in assign.values():
                continue
            members = {k: [s for s in order if assign[s] == k] for k in ("train", "val", "test")}
            donor = "train" if len(members["train"]) >= 2 else max(members, key=lambda k: len(members[k]))
            pick = min(members[donor], key=lambda s: (counts[s], rank[s]))
            assign[pick] = name
    return assign


def split_by_source(
    records: list[Record], val_fraction: float, test_fraction: float
) -> dict[str, list[Record]]:
    """Group records by source and place each source in one split (input order kept)."""
    assign = assign_sources(Counter(r.source for r in records), val_fraction, test_fraction)
    out: dict[str, list[Record]] = {k: [] for k in SPLITS}
    for r in records:
        out[assign[r.source]].append(r)
    return out


def split_by_time(
    records: list[Record], val_from: str, test_from: str, rejects: Rejects | None = None
) -> tuple[dict[str, list[Record]], int]:
    """Split on timestamp cutoffs; return (splits, number dropped for missing_timestamp)."""
    v, t = time_cutoffs(val_from, test_from)
    out: dict[str, list[Record]] = {k: [] for k in SPLITS}
    missing = 0
    for r in records:
        when = r.when()
        if when is None:
            missing += 1
            if rejects is not None:
                file, line = r.origin or ("<unknown>", 0)
                rejects.add(file, line, "missing_timestamp", dumps(r), "split_by='time' needs a timestamp")
            continue
        out["train" if when < v else "val" if when < t else "test"].append(r)
    if records and missing == len(records):
        raise ValueError("split_by='time' but no record has a 'timestamp'; use split_by='source'")
    return out, missing


class Splitter:
    """The final step: collects the stream and returns {"train","val","test": [Record]}.

    Unlike a `Step` it must see every record before placing any (source budgets depend
    on totals), so it holds them in memory; fine for this project's corpus sizes.
    ``stats`` follows the same in == kept + dropped invariant as the streaming steps.
    """

    def __init__(
        self,
        split_by: str = "source",
        *,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        val_from: str = "",
        test_from: str = "",
        rejects: Rejects | None = None,
    ) -> None:
        if split_by not in ("source", "time"):
            raise ValueError(f"split_by must be 'source' or 'time', got {split_by!r}")
        # Validate now, so a bad argument fails before any input is read.
        if split_by == "source":
            check_fractions(val_fraction, test_fraction)
        else:
            time_cutoffs(val_from, test_from)
        self.split_by = split_by
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.val_from, self.test_from = val_from, test_from
        self.rejects = rejects
        self.stats = StepStats(f"split_by_{split_by}")

    def __call__(self, records: Iterable[Record]) -> dict[str, list[Record]]:
        items = list(records)
        self.stats.n_in = len(items)
        if self.split_by == "source":
            splits = split_by_source(items, self.val_fraction, self.test_fraction)
        else:
            splits, missing = split_by_time(items, self.val_from, self.test_from, self.rejects)
            if missing:
                self.stats.dropped["missing_timestamp"] = missing
        self.stats.kept = sum(len(v) for v in splits.values())
        return splits


class StreamSplitter(Splitter):
    """`Splitter` for streams too big for memory: yields (split name, record) pairs.

    By time, each record is routed as it arrives. By source, the stream is first
    written to an on-disk `Spool` while sources are counted (the budgets need the
    totals), then read back and routed; memory holds only the per-source counts.
    Same assignment, same order within each split, same stats as `Splitter`.
    """

    def route(self, records: Iterable[Record]) -> Iterator[tuple[str, Record]]:
        if self.split_by == "time":
            yield from self._route_time(records)
            return
        spool, counts = Spool(), Counter()
        try:
            for r in records:
                spool.append(r)
                counts[r.source] += 1
            self.stats.n_in = len(spool)
            assign = assign_sources(counts, self.val_fraction, self.test_fraction)
            for r in spool:
                self.stats.kept += 1
                yield assign[r.source], r
        finally:
            spool.close()

    def _route_time(self, records: Iterable[Record]) -> Iterator[tuple[str, Record]]:
        v, t = time_cutoffs(self.val_from, self.test_from)
        for r in records:
            self.stats.n_in += 1
            when = r.when()
            if when is None:
                self.stats.dropped["missing_timestamp"] += 1
                if self.rejects is not None:
                    file, line = r.origin or ("<unknown>", 0)
                    self.rejects.add(file, line, "missing_timestamp", dumps(r), "split_by='time' needs a timestamp")
                continue
            self.stats.kept += 1
            yield ("train" if when < v else "val" if when < t else "test"), r
        if self.stats.n_in and not self.stats.kept:
            raise ValueError("split_by='time' but no record has a 'timestamp'; use split_by='source'")
