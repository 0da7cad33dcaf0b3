"""Per-key rate limits: token buckets for requests per minute and tokens per minute.

A bucket holds up to `rate_per_min` units (the burst) and refills continuously at
`rate_per_min / 60` per second. A request costs 1 request unit and
`prompt_tokens + max_tokens * n` token units (what it may use, known before it
runs); if either bucket lacks the units, nothing is taken and the answer is 429 with
`Retry-After` = the seconds until both buckets will hold enough, rounded up.

A cost larger than a bucket can ever hold is refused with `retry_after = None`
(the caller answers 429 saying the request is too large for the limit).
"""
from __future__ import annotations

import math
import time
from typing import Callable


class TokenBucket:
    def __init__(self, rate_per_min: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(rate_per_min)
        self.rate_per_s = rate_per_min / 60.0
        self.level = self.capacity
        self._clock = clock
        self._t = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._t) * self.rate_per_s)
        self._t = now

    def wait_s(self, cost: float) -> float | None:
        """Seconds until `cost` units are available (0 = now); None if it never will be."""
        self._refill()
        if cost > self.capacity:
            return None
        return max(0.0, (cost - self.level) / self.rate_per_s)

    def take(self, cost: float) -> None:
        self._refill()
        self.level -= cost


class RateLimiter:
    """Buckets per key; a rate of 0 turns that limit off."""

    def __init__(self, requests_per_min: float, tokens_per_min: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        self._clock = clock
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}

    @property
    def enabled(self) -> bool:
        return self.requests_per_min > 0 or self.tokens_per_min > 0

    def _for(self, key: str) -> tuple[TokenBucket | None, TokenBucket | None]:
        if key not in self._buckets:
            requests = TokenBucket(self.requests_per_min, self._clock) if self.requests_per_min > 0 else None
            tokens = TokenBucket(self.tokens_per_min, self._clock) if self.tokens_per_min > 0 else None
            self._buckets[key] = (requests, tokens)
        return self._buckets[key]

    def check(self, key: str, tokens: int) -> tuple[bool, int | None, str]:
        """(allowed, retry_after_s, which limit). Takes the units only when allowed."""
        if not self.enabled:
            return True, 0, ""
        requests, toks = self._for(key)
        waits = []
        for bucket, cost, name in ((requests, 1, "requests"), (toks, tokens, "tokens")):
            if bucket is None:
                continue
            wait = bucket.wait_s(cost)
            if wait is None:
                return False, None, name
            if wait > 0:
                waits.append((wait, name))
        if waits:
            wait, name = max(waits)
            return False, max(1, math.ceil(wait)), name
        for bucket, cost in ((requests, 1), (toks, tokens)):
            if bucket is not None:
                bucket.take(cost)
        return True, 0, ""
