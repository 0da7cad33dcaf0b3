"""`ThreadedEngineAdapter`: today's batch-1 `tinystack.infer.Engine` behind the EngineAdapter contract.

Each sequence runs the decode loop on its own worker thread, at most `max_num_seqs`
at once (a ThreadPoolExecutor of that size; more wait in its queue), and hands each
token to the event loop with `call_soon_threadsafe`. It runs the loop itself
(prefill, then one token per forward with the engine's KV cache) with the infer
layer's `sample_batch`, so every SamplingParams knob (penalties, min-p, logprobs)
works; stop strings are cut by the serving layer (detok.py). "Alive" means the
thread pool is running; `kill()` fails every live sequence with EngineDead (what a
crash looks like) and `restart()` starts a fresh pool.

Timing and cost, as close to the AsyncEngine's as a batch-1 loop allows: scheduled =
the worker starts the prefill, first/last token = when they were sampled; device
seconds = wall time of the worker's prefill + decode loop, CPU seconds = the worker
thread's CPU time over it (`time.thread_time`: torch's intra-op threads are not
included). Each forward pass is reported to the step listeners as a batch of one.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

import torch

from tinystack.infer.kv_cache import KVCache
from tinystack.infer.sampler import SampleRow, SamplingParams, sample_batch
from tinystack.infer.step_stats import StepRecord
from tinystack.observe.usage import SequenceUsage
from tinystack.serve.engine.adapter import EngineDead, EngineStats, TokenEvent, UsageCallback


_END = object()


@dataclass(eq=False)
class _Seq:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    on_usage: UsageCallback | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    started: bool = False  # a worker picked it up (it then removes it from the table itself)
    usage: SequenceUsage | None = None  # filled in by the worker as it goes
    _reported: bool = False

    def push(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop closed (server stopped): nobody is listening
            self.cancel.set()

    def report(self) -> None:
        """Hand the sequence's usage to `on_usage` on the event loop, once (any thread)."""
        if self._reported or self.on_usage is None:
            return
        self._reported = True
        usage = self.usage or SequenceUsage(self.request_id, len(self.prompt_ids), 0, None)
        try:
            self.loop.call_soon_threadsafe(self.on_usage, usage)
        except RuntimeError:
            pass


class ThreadedEngineAdapter:
    """Today's `Engine` behind the adapter contract (see the module docstring)."""

    def __init__(self, engine: Any, max_num_seqs: int) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_seq_len: int = int(engine.max_seq_len)
        self.max_num_seqs = max_num_seqs
        try:
            self.eos_token_id: int | None = self.tokenizer.eos_token_id
        except ValueError:
            self.eos_token_id = None
        self._lock = threading.Lock()
        self._seqs: dict[str, _Seq] = {}
        self._running = 0
        self._kv_bytes = 0
        self._last_step = time.monotonic()
        self._executor: ThreadPoolExecutor | None = None
        self._listeners: list[Callable[[StepRecord], None]] = []
        per_token = KVCache.for_model(engine.model.config, batch=1, max_len=1).nbytes
        self._kv_capacity = max(1, per_token * self.max_seq_len * max_num_seqs)  # all slots at full context
        self.restarts = 0
        self.start()

    # ---------------------------------------------------------------- text
    def encode(self, text: str) -> list[int]:
        """Text -> ids (special-token text is plain text); an empty text is the document separator."""
        ids = self.tokenizer.encode_ordinary(text)
        return ids or ([self.eos_token_id] if self.eos_token_id is not None else [0])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._executor = ThreadPoolExecutor(self.max_num_seqs, thread_name_prefix="tinystack-seq")
        self._last_step = time.monotonic()

    def is_alive(self) -> bool:
        return self._executor is not None

    def last_step_age_s(self) -> float:
        """Seconds since a sequence last made progress (0 when idle: nothing to make progress on)."""
        with self._lock:
            busy = self._running > 0
        return time.monotonic() - self._last_step if busy else 0.0

    def kill(self, reason: str = "engine loop stopped") -> None:
        """Stop the engine: every live sequence fails with EngineDead (also how a crash looks)."""
        executor, self._executor = self._executor, None
        with self._lock:
            seqs = list(self._seqs.values())
        for seq in seqs:
            seq.cancel.set()
            seq.push(EngineDead(reason))
            if not seq.started:  # its worker will never run: nothing was spent
                seq.report()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def restart(self) -> None:
        """Start a fresh engine loop (the watchdog calls this when `is_alive()` is False)."""
        self.kill("engine restarted")
        self.restarts += 1
        self.start()

    def close(self) -> None:
        self.kill("server stopped")

    # ---------------------------------------------------------------- requests
    def stats(self) -> EngineStats:
        """KV usage: bytes held / what max_num_seqs full-context caches would hold."""
        with self._lock:
            return EngineStats(self._running, len(self._seqs) - self._running, self._kv_bytes, self.max_num_seqs,
                               kv_usage=self._kv_bytes / self._kv_capacity)

    def add_step_listener(self, listener: Callable[[StepRecord], None]) -> Callable[[], None]:
        """Call `listener(StepRecord)` on the worker thread after every forward pass; returns its remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _step(self, tokens: int, prefill: int, t0: float, c0: float) -> float:
        """Tell the listeners about one forward pass (a batch of one); returns now."""
        now = time.perf_counter()
        rec = StepRecord(1, tokens, prefill, now - t0, time.thread_time() - c0, now)
        for listener in list(self._listeners):
            try:
                listener(rec)
            except Exception:  # metrics must never take the engine down
                pass
        return now

    def abort(self, request_id: str) -> None:
        """Stop `request_id` (no-op if unknown): a queued one never starts, a running one stops
        before its next forward pass and frees its KV cache."""
        with self._lock:
            seq = self._seqs.get(request_id)
        if seq is not None:
            seq.cancel.set()

    async def stream(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     on_usage: UsageCallback | None = None) -> AsyncIterator[TokenEvent]:
        """Tokens of one sequence as they are generated. Closing the iterator early aborts it."""
        seq = _Seq(request_id, list(prompt_ids), params, asyncio.Queue(), asyncio.get_running_loop(), on_usage)
        executor = self._executor
        if executor is None:
            seq.report()
            raise EngineDead("engine loop is not running")
        with self._lock:
            if request_id in self._seqs:
                raise ValueError(f"duplicate request id {request_id!r}")
            self._seqs[request_id] = seq
        try:
            try:
                executor.submit(self._run, seq)
            except RuntimeError as e:  # shut down between the check and the submit
                seq.report()
                raise EngineDead("engine loop is not running") from e
            while True:
                item = await seq.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            seq.cancel.set()
            with self._lock:
                if self._seqs.get(request_id) is seq and not seq.started:
                    del self._seqs[request_id]  # never started: the worker will skip it

    # ---------------------------------------------------------------- worker thread
    def _run(self, seq: _Seq) -> None:
        with self._lock:
            if seq.cancel.is_set() or self._seqs.get(seq.request_id) is not seq:  # aborted while queued
                if self._seqs.get(seq.request_id) is seq:
                    del self._seqs[seq.request_id]
                seq.push(_END)
                seq.report()
                return
            seq.started = True
            self._running += 1
        kv_bytes = 0
        final: Any = _END
        try:
            for event in self._decode(seq):
                if isinstance(event, int):  # the cache was allocated: account for it
                    kv_bytes = event
                    with self._lock:
                        self._kv_bytes += kv_bytes
                    continue
                seq.push(event)
        except BaseException as e:  # the engine failed: the request sees the exception
            final = e
        finally:  # counters first, then the last item: whoever sees the end also sees the memory freed
            with self._lock:
                self._running -= 1
                self._kv_bytes -= kv_bytes
                if self._seqs.get(seq.request_id) is seq:
                    del self._seqs[seq.request_id]
            seq.report()  # before the end: whoever sees the end sees the cost
            seq.push(final)

    def _decode(self, seq: _Seq):
        """Prefill, then one token per forward; yields the cache size once, then TokenEvents."""
        model, p, ids = self.engine.model, seq.params, seq.prompt_ids
        device = getattr(self.engine, "device", torch.device("cpu"))
        gen = torch.Generator(device=device)
        gen.manual_seed(p.seed if p.seed is not None else torch.seed())
        budget = min(p.max_tokens, self.max_seq_len - len(ids))
        cache = KVCache.for_model(model.config, batch=1, max_len=len(ids) + budget,
                                  dtype=next(model.parameters()).dtype, device=device)
        yield cache.nbytes
        out: list[int] = []
        t0, c0 = time.perf_counter(), time.thread_time()
        usage = SequenceUsage(seq.request_id, len(ids), 0, None, scheduled=t0)
        first: float | None = None
        last: float | None = None
        try:
            with torch.inference_mode():
                ts, cs = t0, c0
                logits, _ = model(torch.tensor([ids], device=device), kv_cache=cache, start_pos=0)
                ts, cs = self._step(len(ids), len(ids), ts, cs), time.thread_time()
                self._last_step = time.monotonic()
                while len(out) < budget and not seq.cancel.is_set():
                    tokens, infos = sample_batch(logits[:, -1], [SampleRow(p, gen, ids, out)])
                    token = tokens[0]
                    last = time.perf_counter()
                    first = first or last
                    if (token == self.eos_token_id and not p.ignore_eos) or token in p.stop_token_ids:
                        usage = replace(usage, finish_reason="stop")
                        return
                    out.append(token)
                    yield self._event(token, infos[0])
                    if len(out) == budget or seq.cancel.is_set():
                        return
                    logits, _ = model(torch.tensor([[token]], device=device), kv_cache=cache,
                                      start_pos=len(ids) + len(out) - 1)
                    ts, cs = self._step(1, 0, ts, cs), time.thread_time()
                    self._last_step = time.monotonic()
        finally:
            reason = usage.finish_reason or ("abort" if seq.cancel.is_set() else "length")
            seq.usage = replace(usage, completion_tokens=len(out), finish_reason=reason, first_token=first,
                                last_token=last, cpu_s=time.thread_time() - c0, device_s=time.perf_counter() - t0)

    @staticmethod
    def _event(token: int, info: dict | None) -> TokenEvent:
        if info is None:
            return TokenEvent(token)
        top = tuple(sorted(info["top"].items(), key=lambda kv: -kv[1]))
        return TokenEvent(token, info["logprob"], top)
