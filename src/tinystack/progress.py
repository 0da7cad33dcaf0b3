"""What long commands show on the terminal, for every layer: one console, two kinds of progress bar.

    console                      rich Console for status lines and tables (soft wrap: long lines stay
                                 whole in logs and CI output)
    track(stream, label)         passes items through, drawing a live count and items/s (unknown total)
    progress_bar(label, total)   yields `advance(n=1, info="")` for a loop of known length

Bars draw on stderr, nothing when disabled or when the output is not a terminal, and are
transient by default so logs keep only the result lines.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")
console = Console(soft_wrap=True)
EVERY = 500  # items between redraws of `track`: a redraw per item would cost more than the step


def track(stream: Iterable[T], label: str, enabled: bool = True, unit: str = "docs") -> Iterator[T]:
    if not enabled:
        yield from stream
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}: {task.completed:,} " + unit + "  {task.fields[rate]}"))
    with Progress(*columns,
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None, rate="")
        t0, i = time.perf_counter(), 0
        for i, item in enumerate(stream, start=1):
            if i % EVERY == 0:
                bar.update(task, completed=i, rate=f"{i / max(time.perf_counter() - t0, 1e-9):,.0f} {unit}/s")
            yield item
        bar.update(task, completed=i)


@contextlib.contextmanager
def progress_bar(label: str, total: int, enabled: bool = True, *, completed: int = 0,
                 transient: bool = True) -> Iterator[Callable[..., None]]:
    """Yields `advance(n=1, info="")`; `info` is a short text shown after the count (e.g. the loss)."""
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled, transient=transient)
    with bar:
        task = bar.add_task(label, total=total, completed=completed, info="")
        yield lambda n=1, info=None: bar.update(task, advance=n, **({} if info is None else {"info": info}))
