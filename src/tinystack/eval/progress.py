"""One progress bar for evaluation loops (rich; transient, so logs keep only the result lines)."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextlib.contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`; draws nothing when disabled or when the output is not a terminal."""
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   disable=not enabled, transient=True)
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.update(task, advance=n)
