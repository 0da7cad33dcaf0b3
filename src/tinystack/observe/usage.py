"""What one request used on the engine: its sequences' timing stamps, tokens and cost.

    engine adapter, once per sequence (finished OR aborted)  -> SequenceUsage
        -> RequestUsage.add()   (on the event loop)
    all `expected` sequences reported                        -> settled: callbacks run

A request with n choices runs n engine sequences; its usage is their sum (tokens,
CPU and device seconds) and their envelope in time (first scheduled = earliest,
last token = latest). Each sequence's stamps and cost are the engine's own record,
`tinystack.infer.RequestMetrics` (the one record of them, not a copy of its fields).
An aborted sequence (timeout, client gone, stop string cut by the server) still reports
what it cost, a little after the abort: the request's log line and metrics wait for it
(`when_settled`), so what was paid is never lost.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tinystack.infer.outputs import RequestMetrics


@dataclass(frozen=True)
class SequenceUsage:
    """One engine sequence; `metrics` is the engine's record of it (None: it never reached the engine)."""

    request_id: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None  # the engine's: "stop" | "length" | "abort"; None when the engine failed
    metrics: RequestMetrics | None = None
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served (not computed again)


@dataclass
class RequestUsage:
    """The sequences of one request, reported as they end (see the module docstring)."""

    expected: int = 0
    sequences: list[SequenceUsage] = field(default_factory=list)
    _callbacks: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def expect(self, n: int) -> None:
        """`n` more sequences were sent to the engine; each will report once."""
        self.expected += n

    def add(self, seq: SequenceUsage) -> None:
        """A sequence's report (call on the event loop). Runs the callbacks when the last one arrives."""
        self.sequences.append(seq)
        if self.settled:
            self._fire()

    def settle(self) -> None:
        """Stop waiting (the engine died, or a report is overdue): runs the callbacks with what is known."""
        self.expected = len(self.sequences)
        self._fire()

    @property
    def settled(self) -> bool:
        return len(self.sequences) >= self.expected

    def when_settled(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every sequence has reported (at once if they have)."""
        if self.settled:
            callback()
        else:
            self._callbacks.append(callback)

    def _fire(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    # ------------------------------------------------------------ totals
    def _metrics(self) -> list[RequestMetrics]:
        return [s.metrics for s in self.sequences if s.metrics is not None]

    def _stamps(self, point: str) -> list[float]:
        return [t for m in self._metrics() if (t := getattr(m, point)) is not None]

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served by the prefix cache: the fewest of the request's sequences (the n choices of one
        prompt each report theirs; the first one's prefill is what later ones find cached)."""
        return min((s.cached_tokens for s in self.sequences), default=0)

    @property
    def scheduled(self) -> float | None:
        return min(self._stamps("scheduled"), default=None)

    @property
    def first_token(self) -> float | None:
        return min(self._stamps("first_token"), default=None)

    @property
    def last_token(self) -> float | None:
        return max(self._stamps("last_token"), default=None)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens the engine computed: each sequence that got scheduled fed its prompt."""
        return sum(s.prompt_tokens for s in self.sequences if s.metrics is not None and s.metrics.scheduled is not None)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.sequences)

    @property
    def cpu_s(self) -> float:
        return sum(m.cpu_s for m in self._metrics())

    @property
    def device_s(self) -> float:
        return sum(m.device_s for m in self._metrics())

    @property
    def spec_tokens(self) -> tuple[int, int]:
        """(proposed, accepted) speculative draft tokens of this request's sequences."""
        ms = list(self._metrics())
        return sum(m.spec_proposed for m in ms), sum(m.spec_accepted for m in ms)
