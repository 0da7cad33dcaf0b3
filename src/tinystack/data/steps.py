"""The step abstraction: a small, composable transform over a stream of records.

Like datatrove's pipeline blocks, a step takes an iterator of `Record`s and yields the
ones it keeps (possibly modified). Every step counts what went in, what it kept and
what it dropped *per reason*, so a run can always answer "where did my documents go?".
The invariant ``in == kept + sum(dropped)`` holds for every step once its stream is
exhausted; `StepStats.check` asserts it and the pipeline checks it before writing the
manifest.

Steps compose by nesting generators:

    stream = read_inputs(paths, rejects)
    for step in (Normalize(), LengthFilter(32, 20_000), ExactDedup()):
        stream = step(stream)

A new step (e.g. MinHash near-dedup) subclasses `Step` and implements `process`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from tinystack.data.io.records import Record

MAX_EXAMPLES = 3
EXAMPLE_CHARS = 200


@dataclass
class StepStats:
    """Counters for one step. `extra` holds step-specific numbers (not part of the invariant)."""

    name: str
    n_in: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)  # a few dropped records, for the manifest

    def add_example(self, record: Record, reason: str) -> None:
        """Keep the first `MAX_EXAMPLES` drops (text cut to `EXAMPLE_CHARS`) to show in the manifest."""
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"reason": reason, "source": record.source, "id": record.id,
                                  "text": record.text[:EXAMPLE_CHARS]})

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def check(self) -> None:
        """Raise AssertionError if records were lost or invented (a bug, never bad input)."""
        if self.n_in != self.kept + self.dropped_total:
            raise AssertionError(
                f"step {self.name}: in={self.n_in} != kept={self.kept} + dropped={self.dropped_total}"
            )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "in": self.n_in,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "dropped_total": self.dropped_total,
        }
        if self.extra:
            d["extra"] = self.extra
        if self.examples:
            d["examples"] = self.examples
        return d


class Step:
    """Base class. Subclasses implement `process(record) -> Record | str`:
    return the (possibly new) record to keep it, or a reason string to drop it."""

    name = "step"

    def __init__(self) -> None:
        self.stats = StepStats(self.name)

    def process(self, record: Record) -> Record | str:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, records: Iterable[Record]) -> Iterator[Record]:
        for r in records:
            self.stats.n_in += 1
            out = self.process(r)
            if isinstance(out, str):
                self.stats.dropped[out] += 1
                self.stats.add_example(r, out)
            else:
                self.stats.kept += 1
                yield out
