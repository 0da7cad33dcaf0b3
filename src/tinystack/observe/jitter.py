"""Two sources of latency jitter that are not the model, measured so a stall shows up as a number.

    GcPauses        gc.callbacks: "start" -> "stop" of every collection -> a histogram
                    (tinystack_gc_pause_seconds{generation}). `install(freeze=True)` moves
                    everything alive now (the loaded model, tokenizer, server objects)
                    into the permanent generation: later collections skip it.
    loop_lag(...)   an asyncio task that sleeps `interval_s` and records how much later
                    than asked it woke up (tinystack_event_loop_lag_seconds): a blocking
                    call on the event loop delays every request by exactly that much.

gc.callbacks is process-wide: each server adds its own callback when it starts and
removes it when it stops. A collection runs on whichever thread allocates, so the
callback does only a clock read and a histogram update (thread-safe).
"""
from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from prometheus_client import Histogram


class GcPauses:
    """Times garbage collections into `histogram` (labelled by generation) while installed."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self._start: float | None = None
        self.frozen = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.histogram.labels(str(info.get("generation", "?"))).observe(time.perf_counter() - self._start)
            self._start = None

    def install(self, freeze: bool = False) -> None:
        """Start timing collections; with `freeze`, freeze what is alive now (start-up, model loaded).

        Only the young generations are collected first: a full collection with torch
        loaded is a long pause, and old garbage that gets frozen is at most a one-off
        leak until `uninstall` unfreezes it."""
        if freeze:
            gc.collect(1)
            gc.freeze()
            self.frozen = True
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop timing (and unfreeze, if `install` froze: the server's objects may be garbage now)."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self.frozen:
            gc.unfreeze()
            self.frozen = False


async def loop_lag(histogram: Histogram, interval_s: float) -> None:
    """Run until cancelled: every `interval_s`, record how late the loop woke this task."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval_s)
        histogram.observe(max(0.0, loop.time() - asked - interval_s))
