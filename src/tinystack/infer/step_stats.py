"""What one engine step did and cost, and the engine's running totals — for metrics and cost.

Every `LLMEngine.step()` that runs the model produces one StepRecord:

    batch_size        sequences in the step
    num_tokens        tokens fed to the model (prefill chunks + one per decode)
    prefill_tokens    of which prompt (or recompute) tokens; decode_tokens = the rest
    wall_s            perf_counter seconds the step took (schedule + model + sample)
    cpu_s             process CPU seconds in the same span (torch's intra-op threads
                      work for the step too, so thread_time would miss most of it)

Each step's wall and CPU seconds are shared across the sequences in it by the tokens
they fed (a 100-token prefill chunk pays 100× a one-token decode), so the shares of
all requests add up exactly to the totals of the steps: that is the cost model the
observability layer prices (`RequestMetrics.cpu_s` / `device_s`).

Listeners (`LLMEngine.step_listeners`) are called on the engine's thread after every
step with the record; they must be quick and must not raise (an exception is dropped).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    batch_size: int
    num_tokens: int
    prefill_tokens: int
    wall_s: float
    cpu_s: float
    end: float  # perf_counter when the step ended

    @property
    def decode_tokens(self) -> int:
        return self.num_tokens - self.prefill_tokens


@dataclass
class EngineCounters:
    """Totals since the engine started (read them from any thread: plain ints/floats)."""

    steps: int = 0
    prompt_tokens: int = 0  # prefill tokens computed (recomputes after preemption included)
    generation_tokens: int = 0  # tokens sampled
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, rec: StepRecord, sampled: int) -> None:
        self.steps += 1
        self.prompt_tokens += rec.prefill_tokens
        self.generation_tokens += sampled
        self.wall_s += rec.wall_s
        self.cpu_s += rec.cpu_s
