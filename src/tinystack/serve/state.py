"""Everything one running server shares between requests, built by the app's lifespan.

    ServerState
      adapter      the engine behind its adapter (engine/adapter.py)
      gate         admission: running + queued <= max_num_seqs + max_queued_requests (guards/protect.py)
      breaker      circuit breaker over engine failures (guards/protect.py)
      limiter      per-key token buckets (guards/ratelimit.py)
      keys         API key checker (guards/auth.py)
      chat         chat template (tinystack.infer.chat)
      draining     set on SIGTERM: /ready answers 503, the server finishes what it has
      refusing     set when the shutdown proper starts (after drain_delay_s): new generation
                   requests get 503 server_shutting_down while the in-flight ones finish
      cut()        the grace period ran out: every generation still running ends now, as a 503
                   (or, in a stream, an error event and [DONE]); `cut_signal()` is what it sets

It is created inside the server's event loop (asyncio objects bind to it) and
closed when the server stops, so the same app can be served more than once.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tinystack.config import ServeConfig
from tinystack.infer.chat import ChatFormatter
from tinystack.serve.engine.adapter import EngineAdapter
from tinystack.serve.guards.auth import KeyChecker
from tinystack.serve.guards.protect import AdmissionGate, CircuitBreaker
from tinystack.serve.guards.ratelimit import RateLimiter


@dataclass
class ServerState:
    cfg: ServeConfig
    adapter: EngineAdapter
    gate: AdmissionGate
    breaker: CircuitBreaker
    limiter: RateLimiter
    keys: KeyChecker
    admin: KeyChecker  # the admin routes' keys ([serve] admin_key_env; none: the routes answer 403)
    chat: ChatFormatter
    model_name: str
    lineage: dict[str, Any] = field(default_factory=dict)  # the served model's tinystack.json (+ registry entry)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # for fields a request omits (generation_config)
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    refusing: bool = False
    _cut: asyncio.Future | None = field(default=None, repr=False)
    counters: dict[str, int] = field(default_factory=lambda: {"degraded": 0, "engine_failures": 0,
                                                              "rejected_429": 0, "timeouts": 0, "aborted": 0,
                                                              "rejected_shutdown": 0, "cut_at_shutdown": 0})

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def cut_signal(self) -> asyncio.Future:
        """Done once the shutdown grace period ran out (created on the server's loop at first use)."""
        if self._cut is None:
            self._cut = asyncio.get_running_loop().create_future()
        return self._cut

    def cut(self) -> None:
        """End every generation still running (call on the server's loop)."""
        signal = self.cut_signal()
        if not signal.done():
            signal.set_result(None)

    def settings(self) -> dict[str, Any]:
        """The protection settings in force and the model's sampling defaults (logged at start-up, shown by
        /metrics.json)."""
        c = self.cfg
        return {"max_num_seqs": self.adapter.max_num_seqs, "max_queued_requests": c.max_queued_requests,
                "timeout_s": c.timeout_s, "stall_timeout_s": c.stall_timeout_s, "max_body_bytes": c.max_body_bytes,
                "max_tokens_limit": c.max_tokens_limit, "max_n": c.max_n, "fallback": bool(c.fallback_text),
                "breaker_failures": c.breaker_failures, "breaker_cooldown_s": c.breaker_cooldown_s,
                "auth": self.keys.enabled, "rate_limit_rpm": c.rate_limit_rpm, "rate_limit_tpm": c.rate_limit_tpm,
                "shutdown_grace_s": c.shutdown_grace_s, "sampling_defaults": dict(self.sampling_defaults)}
