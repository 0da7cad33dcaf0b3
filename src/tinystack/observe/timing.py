"""The seven timing points of one request, and the durations derived from them.

    arrival -> validated -> enqueued -> scheduled -> first_token -> last_token -> returned
    |validate_ms (arrival..enqueued)|queue_ms  |prefill_ms  |decode_ms      |respond_ms|
    |<----------------- ttft_ms ------------------------->|
    |<------------------------------------ total_ms ---------------------------------->|

    arrival      the server saw the request (first thing the app does with it)
    validated    body parsed, key checked, prompt tokenised and within every limit
    enqueued     the request asks for a concurrency slot / is handed to the engine
    scheduled    the engine first ran one of its sequences (engine's own clock stamp)
    first_token  the engine produced the first token of any of its choices
    last_token   the engine produced the last token of all its choices
    returned     the response is complete (non-streaming: ready to send; streaming: the final chunk)

Derived, in milliseconds rounded to 0.01: validate_ms, queue_ms, prefill_ms,
decode_ms, respond_ms (consecutive segments that add up exactly to total_ms when
every point is marked), inference_ms (= prefill + decode), ttft_ms and tpot_ms
(decode time per output token after the first; set `output_tokens`).

All points come from one monotonic clock (`time.perf_counter`, shared by all
threads, and the clock the inference engine stamps its RequestMetrics with), so a
point stamped on the engine thread can be compared with one marked on the event
loop. Points must be marked in this order and at most once each; a request that
fails early may skip points (e.g. arrival -> returned), but never go back. Breaking
the order is a bug in the caller and raises `TimingError`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

TIMING_POINTS: tuple[str, ...] = ("arrival", "validated", "enqueued", "scheduled", "first_token", "last_token",
                                  "returned")
_INDEX = {name: i for i, name in enumerate(TIMING_POINTS)}
# name -> (first point, last point) of every derived duration
SPANS: dict[str, tuple[str, str]] = {
    "validate_ms": ("arrival", "enqueued"),
    "queue_ms": ("enqueued", "scheduled"),
    "prefill_ms": ("scheduled", "first_token"),
    "decode_ms": ("first_token", "last_token"),
    "respond_ms": ("last_token", "returned"),
    "inference_ms": ("scheduled", "last_token"),
    "ttft_ms": ("arrival", "first_token"),
    "total_ms": ("arrival", "returned"),
}
SEGMENTS: tuple[str, ...] = ("validate_ms", "queue_ms", "prefill_ms", "decode_ms", "respond_ms")


class TimingError(RuntimeError):
    """A timing point was marked twice, out of order, or before an earlier point's time."""


def _centi_ms(seconds: float) -> int:
    """Seconds -> whole hundredths of a millisecond (the resolution everything is reported in)."""
    return round(seconds * 100_000)


class RequestTiming:
    """Records the timing points of one request; thread-safe.

    `mark(point)` stamps a point with the clock now (or with a time measured
    elsewhere, `at=`). Derived durations are in milliseconds and are `None` while one
    of their two points is missing. `output_tokens` (set by the caller) gives tpot_ms.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._points: dict[str, float] = {}
        self._lock = threading.Lock()
        self.output_tokens: int | None = None

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
            latest = self._latest()
            if latest is not None:
                if _INDEX[latest] > _INDEX[point]:
                    raise TimingError(f"timing point {point!r} marked after later point {latest!r}")
                if stamp < self._points[latest]:
                    raise TimingError(f"timing point {point!r} at {stamp} is earlier than "
                                      f"{latest!r} at {self._points[latest]}")
            self._points[point] = stamp
            return stamp

    def mark_clamped(self, point: str, at: float | None = None) -> float:
        """Mark `point` at `at` (or now), moved up to the latest point marked so far if it is earlier.

        For stamps measured elsewhere that may be a hair early (e.g. another thread's
        reading just before this request's own point): the order stays valid."""
        with self._lock:
            latest = self._latest()
            floor = self._points[latest] if latest is not None else None
        stamp = self._clock() if at is None else at
        return self.mark(point, at=stamp if floor is None else max(stamp, floor))

    def _latest(self) -> str | None:
        for name in reversed(TIMING_POINTS):
            if name in self._points:
                return name
        return None

    def is_marked(self, point: str) -> bool:
        """Whether `point` has been marked."""
        return point in self._points

    @property
    def points(self) -> dict[str, float]:
        """A copy of the marked points, name -> clock reading (seconds)."""
        with self._lock:
            return dict(self._points)

    def span_ms(self, first: str, last: str) -> float | None:
        """Milliseconds from `first` to `last`, both measured from arrival and rounded to 0.01 ms first.

        Rounding the points (not the differences) keeps sums exact: consecutive
        segments add up to the total to the last digit.
        """
        pts = self._points
        if first not in pts or last not in pts:
            return None
        origin = pts.get("arrival", pts[first])
        return (_centi_ms(pts[last] - origin) - _centi_ms(pts[first] - origin)) / 100

    def __getattr__(self, name: str) -> float | None:
        if name in SPANS:  # queue_ms, prefill_ms, ... (see SPANS)
            return self.span_ms(*SPANS[name])
        raise AttributeError(name)

    @property
    def tpot_ms(self) -> float | None:
        """Decode time per output token after the first (None with fewer than 2 tokens)."""
        decode = self.decode_ms
        if decode is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return round(decode / (self.output_tokens - 1), 2)

    def to_dict(self) -> dict[str, float | None]:
        """Every derived duration (SPANS, then tpot_ms) in ms rounded to 0.01; None while unmeasured."""
        out: dict[str, float | None] = {name: self.span_ms(*pts) for name, pts in SPANS.items()}
        out["tpot_ms"] = self.tpot_ms
        return out

    def seconds(self, name: str) -> float | None:
        """A derived duration (e.g. "queue_ms", "tpot_ms") in seconds, or None."""
        ms = self.tpot_ms if name == "tpot_ms" else self.span_ms(*SPANS[name])
        return None if ms is None else ms / 1e3

    def __repr__(self) -> str:
        marked = ", ".join(self._points)
        return f"RequestTiming(marked=[{marked}], {self.to_dict()})"
