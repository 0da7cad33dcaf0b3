"""Runs engine generations off the event loop, at most N at once, each within a deadline.

    run(prompt, params, timing)                                  (event loop)
      mark enqueue -> wait for a slot: asyncio.Semaphore(max_concurrency)
      -> loop.run_in_executor(ThreadPoolExecutor(max_workers=max_concurrency), engine.generate)
         worker thread: stamp start -> engine.generate(..., cancel=event) -> stamp end
      -> asyncio.wait_for(..., remaining time) -> Generation, or InferenceTimeout

Why a thread: `engine.generate` is a blocking loop of torch calls. On the event loop
it would freeze every other request (including /health) for the whole generation;
on a worker thread the loop stays free, and torch releases the GIL in its kernels.

Why semaphore *and* executor of the same size: the semaphore is the queue you can
see (`waiting`) and bound (the deadline); the executor then always has an idle
thread for a request that holds a slot, so nothing queues invisibly inside it.

Timeout: one deadline (`timeout_s`) covers waiting for a slot and generating. When
it passes, the `threading.Event` given to `engine.generate` as `cancel` is set and
the engine stops before its next token. The slot is released by the worker when it
really stops (not when the client is answered), so the concurrency limit counts
work actually running, including generations that are winding down after a timeout.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from tinystack.infer.engine import Generation
from tinystack.infer.sampler import SamplingParams
from tinystack.observe.timing import RequestTiming


class GenerateFn(Protocol):
    def __call__(self, prompt: str, params: SamplingParams, cancel: threading.Event | None = None) -> Generation: ...


class InferenceTimeout(Exception):
    """The deadline passed; `stage` is "queue" (never got a slot) or "inference" (cancelled mid-generation)."""

    def __init__(self, stage: str, timeout_s: float, max_concurrency: int) -> None:
        self.stage = stage
        self.timeout_s = timeout_s
        if stage == "queue":
            msg = (f"request timed out after {timeout_s:g} s waiting for a free slot "
                   f"(all {max_concurrency} generation slots were busy)")
        else:
            msg = f"generation timed out after {timeout_s:g} s and was cancelled"
        super().__init__(msg)


@dataclass(eq=False)  # identity hash: jobs live in a set
class _Job:
    """Hand-shake between the event loop and the worker thread for one generation."""

    cancel: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False  # the worker began (it will release the slot)
    abandoned: bool = False  # the loop gave up before the worker began (the loop released the slot)
    t_start: float = 0.0
    t_end: float = 0.0


class InferenceRunner:
    """Owns the slot semaphore and the worker threads of one running server.

    Create it inside the server's event loop (the app's lifespan does) and `close()`
    it on shutdown.
    """

    def __init__(self, generate: GenerateFn, max_concurrency: int, timeout_s: float) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._generate = generate
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self._sem = asyncio.Semaphore(max_concurrency)
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="tinystack-infer")
        self._jobs: set[_Job] = set()
        self._waiting = 0
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def in_flight(self) -> int:
        """Generations holding a slot (running, or stopping after a timeout)."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return self._waiting

    async def run(self, prompt: str, params: SamplingParams, timing: RequestTiming) -> Generation:
        """Generate within the deadline; marks enqueue, start, end on `timing` and sets prefill/decode ms.

        Raises InferenceTimeout, or whatever `generate` raised (e.g. PromptTooLongError).
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        deadline = loop.time() + self.timeout_s
        timing.mark("enqueue")
        self._waiting += 1
        try:
            got_slot = await self._acquire_slot(max(deadline - loop.time(), 0.0))
        finally:
            self._waiting -= 1
        if not got_slot:
            now = time.perf_counter()
            timing.mark("start", at=now)
            timing.mark("end", at=now)
            raise InferenceTimeout("queue", self.timeout_s, self.max_concurrency)
        self._in_flight += 1
        job = _Job()
        self._jobs.add(job)  # from here on the slot belongs to the job: _release gives it back once
        try:
            future = loop.run_in_executor(self._executor, self._work, job, prompt, params)
        except BaseException:  # e.g. the executor was shut down
            self._release(job)
            raise
        try:
            gen = await asyncio.wait_for(future, max(deadline - loop.time(), 0.0))
        except asyncio.TimeoutError:
            self._abandon(job)
            timing.mark("start", at=job.t_start if job.started else None)
            timing.mark("end")
            raise InferenceTimeout("inference", self.timeout_s, self.max_concurrency) from None
        except asyncio.CancelledError:  # the request task was cancelled (e.g. server shutdown)
            self._abandon(job)
            raise
        except BaseException:
            timing.mark("start", at=job.t_start)
            timing.mark("end", at=job.t_end)
            raise
        timing.mark("start", at=job.t_start)
        timing.mark("end", at=job.t_end)
        timing.prefill_ms = gen.prefill_s * 1e3
        timing.decode_ms = gen.decode_s * 1e3
        return gen

    async def _acquire_slot(self, timeout_s: float) -> bool:
        """Take a slot within `timeout_s`; False on timeout. Never leaks a slot, even when cancelled.

        (Not `asyncio.wait_for(sem.acquire())`: before Python 3.12 it can time out
        after the acquire succeeded, losing the slot for good.)
        """
        if not self._sem.locked():  # a free slot and nobody queued before us: no task, no wait
            return await self._sem.acquire()
        task = asyncio.ensure_future(self._sem.acquire())
        try:
            await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:
            task.cancel()
            if task.done() and not task.cancelled():
                self._sem.release()
            raise
        if not task.done():
            task.cancel()
            try:
                await task  # let the cancellation (or a last-moment acquire) settle
            except asyncio.CancelledError:
                return False
        return True

    def _work(self, job: _Job, prompt: str, params: SamplingParams) -> Generation | None:
        """Worker thread: run one generation unless the loop already gave up; always free the slot."""
        with job.lock:
            if job.abandoned:
                return None
            job.started = True
            job.t_start = time.perf_counter()
        try:
            return self._generate(prompt, params, cancel=job.cancel)
        finally:
            job.t_end = time.perf_counter()
            self._release_threadsafe(job)

    def _abandon(self, job: _Job) -> None:
        """Event loop: stop `job`. A running worker stops at its next token and frees the slot itself."""
        job.cancel.set()
        with job.lock:
            release_here = not job.started
            job.abandoned = True
        if release_here:
            self._release(job)

    def _release_threadsafe(self, job: _Job) -> None:
        loop = self._loop
        try:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._release, job)
        except RuntimeError:  # the loop closed between the check and the call: nothing left to release
            pass

    def _release(self, job: _Job) -> None:
        """Event loop: give the slot of `job` back (once)."""
        if job in self._jobs:
            self._jobs.discard(job)
            self._in_flight -= 1
            self._sem.release()

    def close(self) -> None:
        """Cancel running generations and stop the worker threads (without waiting for them)."""
        for job in list(self._jobs):
            job.cancel.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
