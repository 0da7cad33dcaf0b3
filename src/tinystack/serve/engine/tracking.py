"""Marks a generation request's engine timing points from what it receives, and builds its `timing` object.

    tracker = RequestTracker(ctx)          ctx.usage now collects the engine's per-sequence reports
    tracker.enqueued()                     before execution.run: the request asks for a slot
    tracker.see(item)                      every Delta / Fallback from execution.run
    tracker.done()                         the answer is complete: mark scheduled, first_token,
                                           last_token from the engine's own stamps (usage), or,
                                           where the engine has not reported (a sequence the
                                           server aborted at a stop string), from when the
                                           tokens reached the server
    timing_body(ctx, price)                {"queue_ms", "prefill_ms", "decode_ms", "ttft_ms",
                                            "tpot_ms", "total_ms", ..., "cost_usd"}

Stamps measured on the engine thread are clamped to the points already marked, so
the order of the points always holds.
"""
from __future__ import annotations

import time
from typing import Any

from tinystack.observe.cost import cost_usd
from tinystack.observe.timing import SPANS
from tinystack.serve.api.context import RequestContext
from tinystack.serve.engine.execution import Fallback
from tinystack.serve.engine.generation import Delta


class RequestTracker:
    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.usage = ctx.engine_usage()
        self._first: float | None = None
        self._last: float | None = None
        self._tokens: dict[int, int] = {}

    def enqueued(self) -> None:
        self.ctx.timing.mark_clamped("enqueued")

    def see(self, item: Delta | Fallback) -> None:
        if isinstance(item, Fallback):
            self.ctx.failure = "engine_error"  # a degraded answer is the engine failing
            return
        if item.tokens:
            now = time.perf_counter()
            self._first = self._first or now
            self._last = now
            self._tokens[item.index] = self._tokens.get(item.index, 0) + len(item.tokens)

    def done(self) -> None:
        """Mark the engine's points (idempotent); call before `returned` is marked."""
        t, u = self.ctx.timing, self.usage
        if t.is_marked("returned") or t.is_marked("last_token"):
            return
        first = u.first_token if u.first_token is not None else self._first
        last = u.last_token if u.last_token is not None else self._last
        scheduled = u.scheduled if u.scheduled is not None else first
        for point, stamp in (("scheduled", scheduled), ("first_token", first), ("last_token", last)):
            if stamp is not None and not t.is_marked(point):
                t.mark_clamped(point, stamp)
        t.output_tokens = max(self._tokens.values(), default=0)


def timing_body(ctx: RequestContext, price_per_device_hour: float) -> dict[str, Any]:
    """The request's `timing` object: every duration in ms (None if unmeasured), and its cost when known."""
    out: dict[str, Any] = {name: value for name, value in ctx.timing.to_dict().items()
                           if name in SPANS or name == "tpot_ms"}
    u = ctx.usage
    if u is not None and u.settled and u.sequences:
        out.update(cpu_ms=round(u.cpu_s * 1e3, 3), device_ms=round(u.device_s * 1e3, 3),
                   cost_usd=cost_usd(u.device_s, price_per_device_hour))
    return out
