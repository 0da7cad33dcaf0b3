"""The one place that knows the inference engine's API: everything else in serve/ talks to an `EngineAdapter`.

    adapter.stream(request_id, prompt_ids, SamplingParams, on_usage=)
                                              -> async iterator of TokenEvent (ends at EOS / stop /
                                                 max_tokens); on_usage(SequenceUsage) is called on
                                                 the event loop exactly once per sequence, when the
                                                 engine reports what it did and cost (finished,
                                                 aborted: shortly after the abort, or failed)
    adapter.abort(request_id)                 -> the sequence stops, its KV memory is freed at once
    adapter.stats()                           -> running / waiting / KV in use, and how many
                                                 sequences the engine ended, by its finish reason
    adapter.is_alive(), restart(), last_step_age_s()   -> /health and the watchdog
    adapter.encode / decode / token_text      -> text <-> ids with the engine's tokenizer; encode applies
                                                 the engine's prompt rules (PromptError)
    adapter.compile_constraint(params)        -> params.structured_outputs compiled for that tokenizer
                                                 (GrammarError; blocks: call it off the event loop)

The implementations, chosen by `async_adapter.make_adapter`:

    tinystack.infer.AsyncEngine  -> AsyncEngineAdapter (async_adapter.py): continuous batching
                                    (or the dynamic batcher; max_num_seqs=1 is unbatched) over the
                                    engine's KV cache, one engine thread
    ReplicaAdapter               -> itself (serve/replicas/adapter.py): N engine replicas on Ray Serve,
                                    this server being their gateway
"""
from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tinystack.config import InferConfig
from tinystack.infer import AsyncEngine
from tinystack.observe.usage import SequenceUsage
from tinystack.sampling_params import SamplingParams

UsageCallback = Callable[[SequenceUsage], None]


class RequestRejected(ValueError):
    """The engine refuses this request for good (e.g. it can never fit the KV cache): the client's 400."""


class EngineDead(RuntimeError):
    """The engine loop is not running (it died, or was stopped); the watchdog restarts it."""


class ReplicaLost(EngineDead):
    """The replica running this request died after it had sent tokens (serve/replicas): the request fails
    (503, or an error event in a stream), but the other replicas are fine, so the breaker is not told."""


class EngineBusy(RuntimeError):
    """Every engine replica is at capacity (serve/replicas): the client's 429 with Retry-After, not a failure."""


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; `logprob`/`top_logprobs` are set when the request asked for logprobs."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class EngineStats:
    running: int  # sequences generating now
    waiting: int  # sequences queued inside the engine
    kv_bytes_in_use: int  # KV cache memory held by live sequences (0 when idle)
    max_num_seqs: int
    kv_blocks_used: int | None = None  # paged cache only
    kv_blocks_free: int | None = None
    kv_usage: float = 0.0  # share of the KV cache in use (0-1)
    preemptions: int = 0  # totals since the engine started (paged cache only)
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    spec_proposed_tokens: int = 0  # speculative decoding: draft tokens checked / accepted
    spec_accepted_tokens: int = 0
    # sequences the engine ended since the server started, by the engine's finish reason
    # ("stop" | "length" | "abort"): what really happened there, whatever the client was told
    ended: dict[str, int] = field(default_factory=dict)
    # the engine's measured speed (serve/engine/deadline.py's StepMeter; None before any step ran): the slowest of
    # its recent decode steps, and its slowest recent prefill's seconds per prompt token
    step_s: float | None = None
    prefill_s_per_token: float | None = None


class EngineAdapter(Protocol):
    tokenizer: Any
    max_seq_len: int
    max_num_seqs: int
    eos_token_id: int | None
    restarts: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_text(self, token_id: int) -> str: ...
    def compile_constraint(self, params: SamplingParams) -> Any: ...
    async def embed(self, ids: list[int], pooling: str) -> list[float]: ...
    async def prompt_logprobs(self, ids: list[int], top_n: int,
                              lora: str | None = None) -> list[tuple[float | None, list]]: ...
    def stream(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
               on_usage: UsageCallback | None = None, lora: str | None = None) -> AsyncIterator[TokenEvent]: ...
    def lora_names(self) -> list[str]: ...  # the LoRA adapters loaded (a request's `model` may name one)
    async def add_lora(self, name: str, path: str, replace: bool = False) -> None: ...
    async def remove_lora(self, name: str) -> None: ...
    def add_step_listener(self, listener: Callable[[Any], None]) -> Callable[[], None]: ...
    def abort(self, request_id: str) -> None: ...
    def stats(self) -> EngineStats: ...
    def is_alive(self) -> bool: ...
    def last_step_age_s(self) -> float: ...
    def kill(self, reason: str = ...) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...


def load_engine(model_dir: str | Path, cfg: InferConfig, device: str = "cpu") -> Any:
    """The AsyncEngine for a model directory, built from the [infer] section whole (weight format, KV cache,
    memory budget, scheduler: continuous batching of up to max_num_seqs sequences, or the dynamic batcher's
    batches of max_num_seqs; max_num_seqs=1 is no batching), its set-up printed on stderr. Returns once the
    KV cache's first pages are in memory, so the first requests served do not wait for them."""

    engine = AsyncEngine.from_dir(model_dir, cfg, device)
    print(engine.engine.describe(), file=sys.stderr, flush=True)
    engine.engine.wait_for_kv_pages()
    return engine
