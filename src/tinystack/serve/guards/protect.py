"""Load shedding and failure isolation: the admission gate and the circuit breaker.

AdmissionGate: at most `max_num_seqs + max_queued_requests` sequences inside the
server (running in the engine or queued for it). A request that does not fit is
refused at once with 429 and `Retry-After` instead of joining an unbounded pile-up:
a short queue keeps the engine busy, a long one only adds latency and memory.

CircuitBreaker (closed -> open -> half-open -> closed):

    closed      requests go to the engine; `failure_threshold` consecutive engine
                failures (raised, stalled or dead) open it
    open        requests are answered at once (fallback or 503) without touching
                the engine, for `cooldown_s`
    half-open   one probe request goes to the engine: success closes the breaker,
                failure opens it for another cooldown

Both live on the event loop (no locks needed).
"""
from __future__ import annotations

import time
from typing import Callable


class AdmissionGate:
    def __init__(self, max_num_seqs: int, max_queued_requests: int) -> None:
        self.capacity = max_num_seqs + max_queued_requests
        self.in_flight = 0

    def try_enter(self, n: int = 1) -> bool:
        """Take `n` places (the request's choices) if they fit; False means answer 429."""
        if self.in_flight + n > self.capacity:
            return False
        self.in_flight += n
        return True

    def leave(self, n: int = 1) -> None:
        self.in_flight -= n


class CircuitBreaker:
    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(self, failure_threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.consecutive_failures = 0
        self._opened_at: float | None = None
        self._probe_out = False
        self.times_opened = 0

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return self.CLOSED
        return self.HALF_OPEN if self._clock() - self._opened_at >= self.cooldown_s else self.OPEN

    def retry_after_s(self) -> float:
        """Seconds until the breaker lets a probe through (0 when closed)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self.cooldown_s - (self._clock() - self._opened_at))

    def allow(self) -> bool:
        """May this request use the engine? In half-open state only one probe at a time may."""
        state = self.state
        if state == self.CLOSED or self.failure_threshold <= 0:
            return True
        if state == self.HALF_OPEN and not self._probe_out:
            self._probe_out = True
            return True
        return False

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self._opened_at = None
        self._probe_out = False

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.failure_threshold <= 0:
            return
        if self._probe_out or (self._opened_at is None and self.consecutive_failures >= self.failure_threshold):
            self._opened_at = self._clock()
            self.times_opened += 1
        self._probe_out = False

    def release_probe(self) -> None:
        """The probe ended without saying anything about the engine (e.g. timeout, client gone)."""
        self._probe_out = False
