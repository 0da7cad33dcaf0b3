"""How long a request may take: [serve] timeout_s when it is set, else a budget at the model's measured speed.

A fixed default cut requests that the server had admitted and was serving at its normal speed whenever the
machine was slower than the one the number was chosen on (16 concurrent 128-token requests on a shared 2-core
CPU took longer than 10 s). With timeout_s = 0 (the default) each request gets what its own work, and the work
queued before it, takes at the slowest speed the engine showed over its recent steps, times a margin:

    rounds ahead  = (sequences running + waiting in the engine) // max_num_seqs   (full batches before its turn)
    work_s        = rounds ahead x max_tokens_limit x step_s                      (each of them at most that long)
                  + prompt tokens x prefill_s_per_token + max_tokens x step_s     (its own prefill and decode)
    timeout       = SLACK x work_s + FLOOR_S

step_s is the slowest decode step among the engine's last WINDOW steps and prefill_s_per_token the slowest
prefill step's seconds per token (StepMeter, fed by every engine step); before the engine has measured any
(the first requests after start), FIRST_S. A request's own `timeout` may only lower it; a fixed timeout_s > 0
replaces the rule. A request that stops making progress is caught sooner by the stall detector
([serve] stall_timeout_s), whatever its budget.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

SLACK = 4.0  # the engine's speed varies with the batch's shape, the machine's other load and preemption
FLOOR_S = 10.0  # what no step measures (tokenizing, the HTTP round trip, a scheduler's wait), and never less
FIRST_S = 600.0  # no step measured yet: the openai client's own default timeout
WINDOW = 64  # recent steps the speed is read from


class StepMeter:
    """A step listener (infer.step_stats.StepRecord, on the engine's thread); read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decode: deque[float] = deque(maxlen=WINDOW)  # seconds per decode step
        self._prefill: deque[float] = deque(maxlen=WINDOW)  # seconds per token of steps with a prefill chunk

    def __call__(self, rec: Any) -> None:
        with self._lock:
            if rec.prefill_tokens:
                self._prefill.append(rec.wall_s / max(1, rec.num_tokens))
            elif rec.num_tokens:
                self._decode.append(rec.wall_s)

    @property
    def step_s(self) -> float | None:
        with self._lock:
            return max(self._decode, default=None)

    @property
    def prefill_s_per_token(self) -> float | None:
        with self._lock:
            return max(self._prefill, default=None)


def request_timeout_s(timeout_s: float, max_tokens_limit: int, stats: Any, prompt_tokens: int, max_tokens: int,
                      asked: float | None = None) -> float:
    """The request's time limit (seconds): `timeout_s` ([serve]) when > 0, else the rule above from `stats`
    (serve.engine.adapter.EngineStats: running, waiting, max_num_seqs, step_s, prefill_s_per_token); `asked`,
    the request's own timeout, only lowers it."""
    if timeout_s > 0:
        limit = timeout_s
    elif stats.step_s is None:
        limit = FIRST_S
    else:
        step = stats.step_s
        ahead = (stats.running + stats.waiting) // max(1, stats.max_num_seqs)
        prefill = stats.prefill_s_per_token if stats.prefill_s_per_token is not None else step
        work = ahead * max_tokens_limit * step + prompt_tokens * prefill + max_tokens * step
        limit = SLACK * work + FLOOR_S
    return limit if asked is None else min(limit, asked)
