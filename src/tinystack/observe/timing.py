"""The five timing points of one request, and the durations derived from them.

    arrival --queue?--> enqueue --queue_ms--> start --inference_ms--> end --> returned
    |<------------------------------- total_ms ------------------------------------->|

    arrival   the server saw the request (first thing the app does with it)
    enqueue   the request is valid and starts waiting for a concurrency slot
    start     inference starts (a slot was free and a worker thread picked it up)
    end       inference ends (the engine returned, or the server stopped waiting)
    returned  the response is ready to be sent

All points come from one monotonic clock (`time.perf_counter`, shared by all
threads), so a point marked on a worker thread can be compared with one marked on
the event loop. Points must be marked in this order and at most once each; a
request that fails early may skip points (e.g. arrival -> returned), but never go
back. Breaking the order is a bug in the caller and raises `TimingError`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

TIMING_POINTS: tuple[str, ...] = ("arrival", "enqueue", "start", "end", "returned")
_INDEX = {name: i for i, name in enumerate(TIMING_POINTS)}


class TimingError(RuntimeError):
    """A timing point was marked twice, out of order, or before an earlier point's time."""


def _centi_ms(seconds: float) -> int:
    """Seconds -> whole hundredths of a millisecond (the resolution everything is reported in)."""
    return round(seconds * 100_000)


class RequestTiming:
    """Records the five timing points of one request; thread-safe.

    `mark(point)` stamps a point with the clock now (or with a time measured
    elsewhere, `at=`). Derived durations are in milliseconds and are `None` while one
    of their two points is missing. `prefill_ms` / `decode_ms` are the engine's own
    split of inference time; set them when known.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._points: dict[str, float] = {}
        self._lock = threading.Lock()
        self.prefill_ms: float | None = None
        self.decode_ms: float | None = None

    def mark(self, point: str, at: float | None = None) -> float:
        """Stamp `point` (with `at`, a `clock()` reading, or now) and return the stamp.

        Raises ValueError for an unknown point name and TimingError when `point` was
        already marked, when a later point was already marked, or when `at` is earlier
        than the latest point marked so far.
        """
        if point not in _INDEX:
            raise ValueError(f"unknown timing point {point!r}; expected one of {TIMING_POINTS}")
        with self._lock:
            if point in self._points:
                raise TimingError(f"timing point {point!r} was already marked")
            stamp = self._clock() if at is None else at
            for earlier in reversed(TIMING_POINTS):  # the latest point marked so far
                if earlier in self._points:
                    if _INDEX[earlier] > _INDEX[point]:
                        raise TimingError(f"timing point {point!r} marked after later point {earlier!r}")
                    if stamp < self._points[earlier]:
                        raise TimingError(f"timing point {point!r} at {stamp} is earlier than "
                                          f"{earlier!r} at {self._points[earlier]}")
                    break
            self._points[point] = stamp
            return stamp

    def is_marked(self, point: str) -> bool:
        """Whether `point` has been marked."""
        return point in self._points

    @property
    def points(self) -> dict[str, float]:
        """A copy of the marked points, name -> clock reading (seconds)."""
        with self._lock:
            return dict(self._points)

    def _span_ms(self, first: str, last: str) -> float | None:
        """Milliseconds from `first` to `last`, both measured from arrival and rounded to 0.01 ms first.

        Rounding the points (not the differences) keeps sums exact: queue + inference
        can never exceed total because of rounding.
        """
        pts = self._points
        if first not in pts or last not in pts:
            return None
        origin = pts.get("arrival", pts[first])
        return (_centi_ms(pts[last] - origin) - _centi_ms(pts[first] - origin)) / 100

    @property
    def queue_ms(self) -> float | None:
        """enqueue -> start: time spent waiting for a concurrency slot and a worker."""
        return self._span_ms("enqueue", "start")

    @property
    def inference_ms(self) -> float | None:
        """start -> end: time the engine worked on the request."""
        return self._span_ms("start", "end")

    @property
    def total_ms(self) -> float | None:
        """arrival -> returned: the whole request as the server saw it."""
        return self._span_ms("arrival", "returned")

    def to_dict(self) -> dict[str, float | None]:
        """queue_ms, inference_ms, total_ms (None while unmeasured), plus prefill_ms/decode_ms when set.

        All values are milliseconds rounded to 0.01.
        """
        out: dict[str, float | None] = {
            "queue_ms": self.queue_ms,
            "inference_ms": self.inference_ms,
            "total_ms": self.total_ms,
        }
        if self.prefill_ms is not None:
            out["prefill_ms"] = round(self.prefill_ms, 2)
        if self.decode_ms is not None:
            out["decode_ms"] = round(self.decode_ms, 2)
        return out

    def __repr__(self) -> str:
        marked = ", ".join(self._points)
        return f"RequestTiming(marked=[{marked}], {self.to_dict()})"
