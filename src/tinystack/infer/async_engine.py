"""AsyncEngine: the engine on its own thread, requests streamed to asyncio callers.

    caller (event loop)                         engine thread
    add_request(id, prompt, params) --inbox-->  enqueue; step(); step(); ...
      -> RequestStream (async iterator)  <--call_soon_threadsafe-- TokenDelta per step
    abort(id)                        --inbox-->  LLMEngine.abort: blocks freed, final delta "abort"
    await call(fn)                   --inbox-->  fn(LLMEngine) between two steps (embeddings: the model is
      -> fn's result or its exception  <--call_soon_threadsafe--  the engine thread's to run)

One thread owns the LLMEngine (it is not thread-safe); callers only touch the inbox.
`add_request` tokenises and checks admission in the caller's thread, so a request that
can never run raises there (PromptTooLongError / AdmissionError) before anything is queued.
Leaving a stream early (`aclose`, or garbage collection of an unfinished async for) aborts it,
so a client that disconnects frees its blocks. Counters for tests and health checks:
num_free_blocks, num_used_blocks, num_running, num_waiting; liveness for watchdogs:
is_alive() and last_step_time (perf_counter of the loop's latest pass, idle waits included).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import AsyncIterator, Callable, TypeVar

from tinystack.config import InferConfig
from tinystack.infer.llm_engine import LLMEngine
from tinystack.infer.loading import load_for_inference
from tinystack.infer.outputs import RequestOutput, TokenDelta
from tinystack.sampling_params import SamplingParams

T = TypeVar("T")


class RequestStream:
    """The async iterator of one request's TokenDeltas; ends after the delta with a finish_reason."""

    def __init__(self, engine: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop):
        self.engine, self.request_id, self.loop = engine, request_id, loop
        self.queue: asyncio.Queue[TokenDelta | BaseException] = asyncio.Queue()
        self.finished = False
        self.output: RequestOutput | None = None

    def __aiter__(self) -> AsyncIterator[TokenDelta]:
        return self

    async def __anext__(self) -> TokenDelta:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished, self.output = True, item.output
        return item

    async def aclose(self) -> None:
        if not self.finished:
            self.engine.abort(self.request_id)
            self.finished = True


def _stopped(engine: LLMEngine) -> None:
    raise RuntimeError("the engine loop stopped")


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_wait_s: float = 0.01):
        self.engine = engine
        engine.stream_text = True
        self._inbox: deque[tuple[str, object]] = deque()
        self._streams: dict[str, RequestStream] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._idle_wait_s = idle_wait_s
        self.last_step_time = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="tinystack-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_dir(cls, model_dir, config: InferConfig | None = None, device: str = "cpu") -> AsyncEngine:
        """The engine for a model directory, loaded and built from [infer] (`config`, whole)."""
        model, tok = load_for_inference(model_dir, config, device)
        return cls(LLMEngine(model, tok, config))

    # -- caller side (event loop) --
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    lora: str | None = None) -> RequestStream:
        seq = self.engine.make_sequence(request_id, prompt, params, lora)
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        with self._cond:
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already running")
            self._streams[request_id] = stream
            self._inbox.append(("add", seq))
            self._cond.notify()
        return stream

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._inbox.append(("abort", request_id))
            self._cond.notify()

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine) run on the engine thread between two steps (the LLMEngine is not thread-safe), awaited."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._cond:
            if self._stop or not self._thread.is_alive():
                raise RuntimeError("the engine loop is not running")
            self._inbox.append(("call", (fn, future, loop)))
            self._cond.notify()
        return await future

    async def generate(self, request_id: str, prompt: str, params: SamplingParams) -> RequestOutput:
        stream = self.add_request(request_id, prompt, params)
        async for _ in stream:
            pass
        assert stream.output is not None
        return stream.output

    def is_alive(self) -> bool:
        """Is the engine thread running? (False after shutdown or if the loop died.)"""
        return self._thread.is_alive()

    def last_step_age_s(self) -> float:
        """Seconds since the loop last stepped or woke up; grows without bound when it is stuck."""
        return time.perf_counter() - self.last_step_time

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=10)

    @property
    def num_free_blocks(self) -> int:
        return self.engine.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.engine.num_used_blocks

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + sum(1 for op, _ in list(self._inbox) if op == "add")

    # -- engine thread --
    def _emit(self, delta: TokenDelta | BaseException, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if isinstance(delta, BaseException) or delta.finished:
            self._streams.pop(request_id, None)
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, delta)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            pass

    def _run_call(self, fn: Callable[[LLMEngine], object], future: asyncio.Future, loop) -> None:
        try:
            result, error = fn(self.engine), None
        except Exception as e:  # the caller's to handle; the engine thread goes on
            result, error = None, e

        def settle() -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's loop is closed
            pass

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._inbox and not self.engine.has_unfinished():
                    self.last_step_time = time.perf_counter()  # idle is alive, not stalled
                    self._cond.wait(1.0)
                if self._stop:
                    for op, arg in self._inbox:  # an awaited call must not wait forever
                        if op == "call":
                            self._run_call(_stopped, *arg[1:])
                    break
                ops = list(self._inbox)
                self._inbox.clear()
            for op, arg in ops:
                if op == "add":
                    self.engine.enqueue(arg)
                elif op == "call":
                    self._run_call(*arg)
                elif (out := self.engine.abort(arg)) is not None:
                    self._emit(TokenDelta(arg, finish_reason="abort", output=out), arg)
            self.last_step_time = time.perf_counter()
            try:
                deltas = self.engine.step()
            except Exception as e:  # a failed step fails the requests in it, not the engine thread
                for rid in list(self._streams):
                    self.engine.abort(rid)
                    self._emit(e, rid)
                continue
            for d in deltas:
                self._emit(d, d.request_id)
            if not deltas and self.engine.has_unfinished():
                with self._cond:  # e.g. the dynamic batcher waiting for max_wait: do not spin
                    self._cond.wait(self._idle_wait_s)
