"""Progress bars for long data runs: live record count and docs/s on stderr (rich).

`track(stream, label, enabled)` passes records through unchanged; the bar is
transient (gone when done) so logs and the final summary table stay clean.
"""
from __future__ import annotations

import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
EVERY = 500  # records between redraws: a redraw per record would cost more than the step


def track(stream: Iterable[T], label: str, enabled: bool = True) -> Iterator[T]:
    if not enabled:
        yield from stream
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}: {task.completed:,} docs  {task.fields[rate]}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None, rate="")
        t0, i = time.perf_counter(), 0
        for i, item in enumerate(stream, start=1):
            if i % EVERY == 0:
                bar.update(task, completed=i, rate=f"{i / max(time.perf_counter() - t0, 1e-9):,.0f} docs/s")
            yield item
        bar.update(task, completed=i)
