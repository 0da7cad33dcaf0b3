"""What the engine hands back: finished RequestOutputs and streamed TokenDeltas, with timing."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """perf_counter seconds: arrival -> scheduled (first time) -> first token -> last token -> finished.

    The one record of a request's engine timing points: the Sequence stamps it as it runs,
    RequestOutput carries a copy, and observability reads the same record
    (tinystack.observe.usage.SequenceUsage.metrics) — the names are the timing points of
    tinystack.observe.timing. `cpu_s` / `device_s`: this request's share of the CPU and wall
    seconds of the engine steps it took part in, shared by tokens fed (step_stats.py) — what it cost.
    """

    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    cpu_s: float = 0.0
    device_s: float = 0.0
    spec_proposed: int = 0  # speculative decoding (speculative.py): draft tokens checked / accepted
    spec_accepted: int = 0

    @property
    def spec_acceptance(self) -> float | None:
        """Share of this request's draft tokens the target accepted (None: it never speculated)."""
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else None

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def prefill_s(self) -> float | None:
        """First scheduled -> first token: the prompt's prefill (chunks) and the first sample."""
        return None if self.first_token is None or self.scheduled is None else self.first_token - self.scheduled

    @property
    def decode_s(self) -> float | None:
        return None if self.first_token is None or self.last_token is None else self.last_token - self.first_token


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort"; None while running
    logprobs: list[dict] | None  # per token {"logprob": float, "top": {id: logprob}} when asked for
    metrics: RequestMetrics
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class TokenDelta:
    """What one step added to one request: new token ids and the text they complete."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    output: RequestOutput | None = None  # set on the last delta
    logprobs: list[dict] | None = None  # one per token id, when the request asked for logprobs

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
