"""Run the n choices of one request on the engine and merge them into one stream of `Delta`s.

    generate(adapter, prompts, params, n=, stops=, deadline=, stall_timeout_s=, usage=)
      -> one task per choice (n per prompt): adapter.stream(request_id-i) -> IncrementalText (stop strings)
      -> one asyncio.Queue -> Delta(index, text, tokens, finish_reason) in arrival order
      -> each choice's engine usage (stamps, tokens, cost) -> usage.add, also when aborted

Failure modes, all raised from the iterator, all of which abort every choice (so
the engine frees their KV memory at once) before they propagate:

    DeadlineExceeded   the request's deadline passed                           -> 504
    EngineStalled      no token from the engine for `stall_timeout_s`          -> degraded / 503
    EngineFailed       the engine raised (or died) while running a choice      -> degraded / 503
    ServerStopping     `stop` was set: the server's shutdown grace ran out     -> 503
    CancelledError     the client went away (the caller cancels the task)      -> nothing to answer

Choice i uses seed + i, so n > 1 with a seed gives n different but reproducible answers.

The merged queue is read with `_get_within`, not `asyncio.wait_for`: on Python < 3.12,
wait_for returns the item (and drops the cancellation) when the task is cancelled in the
moment the item arrives, so a client that went away kept its sequences generating to the end.
"""
from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Sequence

from tinystack.observe.usage import RequestUsage, SequenceUsage
from tinystack.sampling_params import SamplingParams
from tinystack.serve.engine.adapter import EngineAdapter, TokenEvent
from tinystack.serve.engine.detok import IncrementalText


class DeadlineExceeded(Exception):
    """The request ran out of time."""


class EngineStalled(Exception):
    """The engine produced nothing for too long."""


class EngineFailed(Exception):
    """The engine raised while generating; the original exception is the __cause__."""


class ServerStopping(Exception):
    """The server is shutting down and its grace period for running requests is over."""


@dataclass
class Delta:
    """New text of choice `index`; `finish_reason` is set on the choice's last delta."""

    index: int
    text: str
    tokens: list[TokenEvent] = field(default_factory=list)
    finish_reason: str | None = None


async def _run_choice(adapter: EngineAdapter, request_id: str, index: int, prompt_ids: list[int],
                      params: SamplingParams, stops: Sequence[str], out: asyncio.Queue,
                      usage: RequestUsage | None, started: list[bool], lora: str | None) -> None:
    started[index] = True  # no suspension from here to the adapter's stream body: it will report usage
    text = IncrementalText(adapter.decode, stops)
    count = 0
    try:
        async with aclosing(adapter.stream(request_id, prompt_ids, params,
                                           usage.add if usage is not None else None, lora=lora)) as tokens:
            async for event in tokens:
                count += 1
                delta = text.push(event.token_id)
                if text.stopped:
                    out.put_nowait(Delta(index, delta, [event], "stop"))
                    return
                out.put_nowait(Delta(index, delta, [event]))
        out.put_nowait(Delta(index, text.flush(), [], "length" if count >= params.max_tokens else "stop"))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        out.put_nowait(e)


_TIMED_OUT = object()


async def _get_within(queue: asyncio.Queue, timeout: float, stop: asyncio.Future | None) -> object:
    """The next item, or _TIMED_OUT after `timeout` seconds; raises ServerStopping once `stop` is done.
    A cancellation always propagates (asyncio.wait never swallows one), and an item is never lost:
    a getter cancelled after the item was put leaves it in the queue."""
    if stop is not None and stop.done():
        raise ServerStopping()
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter} if stop is None else {getter, stop}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    if stop is not None and stop.done():
        raise ServerStopping()
    return _TIMED_OUT


async def generate(adapter: EngineAdapter, prompts: Sequence[list[int]], params: SamplingParams, *, n: int = 1,
                   stops: Sequence[str] = (), deadline: float, stall_timeout_s: float,
                   usage: RequestUsage | None = None, stop: asyncio.Future | None = None,
                   lora: str | None = None) -> AsyncIterator[Delta]:
    """Deltas of the n choices of every prompt (choice c answers prompts[c // n]; see the module docstring).
    `deadline` is on the loop's clock. `usage` expects a report per choice; each choice's adapter stream
    delivers one. `stop` done: ServerStopping. `lora`: the LoRA adapter every choice runs with (None: the base)."""
    loop = asyncio.get_running_loop()
    base = uuid.uuid4().hex
    total = len(prompts) * n
    ids = [f"{base}-{i}" for i in range(total)]
    queue: asyncio.Queue = asyncio.Queue()
    tasks = []
    started = [False] * total
    if usage is not None:
        usage.expect(total)
    for i, rid in enumerate(ids):
        p = params if params.seed is None else replace(params, seed=params.seed + i % n)
        tasks.append(asyncio.create_task(_run_choice(adapter, rid, i, prompts[i // n], p, stops, queue, usage,
                                                     started, lora)))
    finished = 0
    try:
        while finished < total:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceeded()
            item = await _get_within(queue, min(remaining, stall_timeout_s), stop)
            if item is _TIMED_OUT:
                # the loop's timers may fire a hair early: a wait bounded by the deadline that ran
                # out is the deadline, even if loop.time() is not quite past it yet
                if remaining <= stall_timeout_s or deadline - loop.time() <= 0:
                    raise DeadlineExceeded()
                if adapter.stats().waiting > 0 and adapter.last_step_age_s() < stall_timeout_s:
                    continue  # our choice is queued behind others that are progressing: not a stall
                raise EngineStalled()
            if isinstance(item, Exception):
                raise EngineFailed(str(item)) from item
            if item.finish_reason is not None:
                finished += 1
            yield item
    finally:
        for rid in ids:
            adapter.abort(rid)
        for t in tasks:
            t.cancel()
        if usage is not None:  # a choice cancelled before it started never reached the engine
            for i in (i for i in range(total) if not started[i]):
                usage.add(SequenceUsage(ids[i], len(prompts[i // n]), 0, None))
