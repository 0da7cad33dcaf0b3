"""One admitted request on the engine, with every protection around it.

    admit(state, key, prep)           rate limit (429 + Retry-After) -> circuit breaker
                                      (open: fallback / 503) -> admission gate (429 + Retry-After)
    run(state, prep, usage)           server shutting down: ApiError 503 server_shutting_down;
                                      else an async iterator of Delta (generation.py), or a single
                                      `Fallback` when the engine failed and a fallback is set;
                                      `usage` (observe.RequestUsage) gets every choice's engine
                                      stamps and cost, aborted ones included

    deadline passed       -> every choice aborted, ApiError 504
    engine raised/stalled -> every choice aborted, breaker.record_failure(),
                             Fallback(text) if cfg.fallback_text else ApiError 503
    every replica full    -> (EngineBusy, serve/replicas) every choice aborted, ApiError 429 + Retry-After
    its replica was lost  -> (ReplicaLost, serve/replicas) every choice aborted, ApiError 503; not a
                             breaker failure: the other replicas are well
    client went away      -> the caller cancels the task: every choice aborted
    shutdown grace over   -> every choice aborted, ApiError 503 server_shutting_down (state.cut)
    success               -> breaker.record_success()

The gate's places are given back when the iterator closes, whatever happened.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import AsyncIterator

from tinystack.observe.usage import RequestUsage
from tinystack.serve.api.errors import SERVER_ERROR, TIMEOUT, ApiError
from tinystack.serve.api.requests import Prepared
from tinystack.serve.engine.adapter import EngineBusy, EngineDead, ReplicaLost, TokenEvent
from tinystack.serve.engine.deadline import request_timeout_s
from tinystack.serve.engine.generation import (
    DeadlineExceeded,
    Delta,
    EngineFailed,
    EngineStalled,
    ServerStopping,
    generate,
)
from tinystack.serve.state import ServerState

logger = logging.getLogger("tinystack.serve")


@dataclass
class Fallback:
    """The engine failed; answer every choice with `text`, marked degraded."""

    text: str


def _unavailable(state: ServerState, why: str) -> ApiError:
    retry = max(1, round(state.breaker.retry_after_s())) if state.breaker.state != "closed" else 1
    return ApiError(503, f"the model is unavailable: {why}; retry later", "engine_unavailable", SERVER_ERROR,
                    headers={"Retry-After": str(retry)})


def shutting_down(why: str, failure: str) -> ApiError:
    """503 for a request the stopping server will not (or no longer) serve; the client retries elsewhere."""
    return ApiError(503, f"the server is shutting down: {why}; retry on another instance", "server_shutting_down",
                    SERVER_ERROR, headers={"Retry-After": "1", "Connection": "close"}, failure=failure)


def check_rate(state: ServerState, key: str, tokens: int) -> None:
    """A request of `tokens` (a generation: prompt + max_tokens x n; embeddings: the inputs') by `key` within its
    per-minute limits, else a 429 saying which and when to retry."""
    ok, retry, which = state.limiter.check(key, tokens)
    if ok:
        return
    state.count("rejected_429")
    if retry is None:
        raise ApiError(429, f"this request needs {tokens} tokens, more than the limit of "
                            f"{state.limiter.tokens_per_min:g} tokens per minute allows", "rate_limit_exceeded",
                       "rate_limit_error")
    limit = state.limiter.requests_per_min if which == "requests" else state.limiter.tokens_per_min
    raise ApiError(429, f"rate limit of {limit:g} {which} per minute reached; retry in {retry} s",
                   "rate_limit_exceeded", "rate_limit_error", headers={"Retry-After": str(retry)})


async def run(state: ServerState, prep: Prepared, usage: RequestUsage | None = None
              ) -> AsyncIterator[Delta | Fallback]:
    """Deltas of the request's choices (see the module docstring). Raises ApiError."""
    cfg = state.cfg
    if state.refusing:  # not a lack of capacity we could wait out here: another instance must take it
        state.count("rejected_shutdown")
        raise shutting_down("it takes no new requests", "overloaded")
    if not state.breaker.allow():
        if cfg.fallback_text:
            state.count("degraded")
            yield Fallback(cfg.fallback_text)
            return
        raise _unavailable(state, "the circuit breaker is open after repeated engine failures")
    probe = state.breaker.state == "half_open"
    if not state.gate.try_enter(prep.choices):
        if probe:
            state.breaker.release_probe()
        state.count("rejected_429")
        raise ApiError(429, f"server is at capacity ({state.gate.capacity} sequences running or queued); "
                            "retry shortly", "server_overloaded", "rate_limit_error", headers={"Retry-After": "1"})
    loop = asyncio.get_running_loop()
    settled = False
    try:
        deltas = generate(state.adapter, prep.prompts, prep.params, n=prep.n, stops=prep.stops,
                          deadline=loop.time() + prep.timeout_s, stall_timeout_s=cfg.stall_timeout_s, usage=usage,
                          stop=state.cut_signal(), lora=prep.lora)
        try:
            async for delta in deltas:
                yield delta
        finally:
            await deltas.aclose()
        state.breaker.record_success()
        settled = True
    except DeadlineExceeded:
        state.count("timeouts")
        raise ApiError(504, f"request timed out after {prep.timeout_s:g} s; it was cancelled", "timeout",
                       TIMEOUT) from None
    except ServerStopping:
        state.count("cut_at_shutdown")
        raise shutting_down(f"its grace period of {cfg.shutdown_grace_s:g} s ran out before this request finished",
                            "aborted") from None
    except (EngineFailed, EngineStalled) as e:
        if isinstance(e.__cause__, EngineBusy):  # every replica full: load to shed, not an engine failure
            state.count("rejected_429")
            raise ApiError(429, "every replica is at capacity; retry shortly", "server_overloaded",
                           "rate_limit_error", headers={"Retry-After": "1"}) from None
        if isinstance(e.__cause__, ReplicaLost):  # one replica died; Ray Serve replaces it, the rest serve on
            state.count("replica_lost")
            raise _unavailable(state, "the replica serving it was lost") from None
        settled = True
        state.breaker.record_failure()
        state.count("engine_failures")
        why = "it stalled" if isinstance(e, EngineStalled) else "it failed"
        logger.warning("engine failure (%s): %r", why, e.__cause__ or e)
        if cfg.fallback_text:
            state.count("degraded")
            yield Fallback(cfg.fallback_text)
            return
        raise _unavailable(state, why) from None
    finally:
        state.gate.leave(prep.choices)
        if probe and not settled:
            state.breaker.release_probe()


async def prompt_events(state: ServerState, ids: list[int], top_n: int | None,
                        lora: str | None = None) -> list[TokenEvent]:
    """A prompt's tokens as an echoed answer starts with them: with top_n (the request's logprobs), each scored
    after the ones before it on the engine thread (eval.scoring.prompt_logprobs; the first has no logprob), by
    the base model or the LoRA adapter `lora`. Raises ApiError 503 when the engine is dead, 404 when the adapter
    was unloaded meanwhile."""
    if top_n is None:
        return [TokenEvent(t) for t in ids]
    try:
        scored = await state.adapter.prompt_logprobs(ids, top_n, lora)
    except EngineDead as e:
        raise _unavailable(state, str(e)) from None
    except KeyError as e:
        raise ApiError(404, e.args[0], "model_not_found", param="model") from None
    return [TokenEvent(t, lp, tuple(top)) for t, (lp, top) in zip(ids, scored)]


async def embed(state: ServerState, inputs: list[list[int]]) -> list[list[float]]:
    """Embeddings of token-id inputs ([serve] embedding_pooling), each computed on the engine between two of its
    steps (so running generations wait for one input at a time, never a whole batch). Raises ApiError: 503 while
    shutting down or when the engine is dead, 504 past the time limit (deadline.py: the inputs' prefill)."""
    if state.refusing:
        state.count("rejected_shutdown")
        raise shutting_down("it takes no new requests", "overloaded")
    out = []
    limit = request_timeout_s(state.cfg.timeout_s, state.cfg.max_tokens_limit, state.adapter.stats(),
                              sum(len(ids) for ids in inputs), 0)
    try:
        async with asyncio.timeout(limit):
            for ids in inputs:
                out.append(await state.adapter.embed(ids, state.cfg.embedding_pooling))
    except TimeoutError:
        state.count("timeouts")
        raise ApiError(504, f"embeddings took longer than {limit:g} s", "timeout", TIMEOUT) from None
    except EngineDead as e:
        raise _unavailable(state, str(e)) from None
    return out
