"""`AsyncEngineAdapter`: the continuous-batching `tinystack.infer.AsyncEngine` behind the EngineAdapter contract.

    stream(id, prompt_ids, params) -> AsyncEngine.add_request -> RequestStream of TokenDeltas
                                      -> one TokenEvent per new token id
    abort(id)                      -> AsyncEngine.abort (its blocks are freed on the engine thread)
    stats()                        -> num_running / num_waiting / num_used_blocks x bytes per block,
                                      KV usage, preemptions, prefix-cache hits and queries, and
                                      the sequences ended by finish reason (from their final outputs)
    on_usage(SequenceUsage)        <- the final output's RequestMetrics (stamps, cpu_s, device_s):
                                      from the finished delta, or, when the caller left early,
                                      from the abort's output, read by a small drain task
    add_step_listener(fn)          -> LLMEngine.step_listeners (StepRecord per engine step)

Logprobs stream with their tokens (one per TokenDelta token). "Alive" is the engine
thread being alive; `restart()` stops it, aborts what this server had in it, and
starts a fresh AsyncEngine over the same LLMEngine (weights and KV storage are kept).
"""
from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, AsyncIterator, Callable

from tinystack.eval.scoring import prompt_logprobs
from tinystack.infer import AsyncEngine
from tinystack.infer.embeddings import embed
from tinystack.infer.llm_engine import PromptError
from tinystack.infer.memory import AdmissionError
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.observe.usage import SequenceUsage
from tinystack.sampling_params import SamplingParams
from tinystack.serve.engine.adapter import (
    EngineAdapter,
    EngineDead,
    EngineStats,
    RequestRejected,
    TokenEvent,
    UsageCallback,
)
from tinystack.serve.engine.deadline import StepMeter

DRAIN_TIMEOUT_S = 30.0  # an aborted sequence's cost report is waited for this long at most


def _usage(request_id: str, prompt_len: int, output: Any) -> SequenceUsage:
    """A sequence's usage from the engine's RequestOutput (None: it never reached the engine, or failed)."""
    if output is None:
        return SequenceUsage(request_id, prompt_len, 0, None)
    return SequenceUsage(request_id, prompt_len, len(output.token_ids), output.finish_reason, output.metrics,
                         output.num_cached_tokens)


class AsyncEngineAdapter:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.llm = engine.engine
        self.tokenizer = self.llm.tokenizer
        self.max_seq_len: int = int(self.llm.max_seq_len)
        self.max_num_seqs: int = self.llm.scheduler.max_num_seqs
        self.eos_token_id: int | None = getattr(self.tokenizer, "eos_token_id", None)
        self.restarts = 0
        self._block_bytes = self.llm.storage.nbytes // max(1, self.llm.block_manager.num_blocks)
        self._live: dict[str, Any] = {}  # request id -> RequestStream
        self._drains: set[asyncio.Task] = set()  # cost reports of aborted sequences, awaited
        self._ended: Counter[str] = Counter()  # final outputs seen, by the engine's finish reason
        self._meter = StepMeter()  # the engine's recent speed, for the requests' time limits
        self.llm.step_listeners.append(self._meter)

    # ---------------------------------------------------------------- text
    def encode(self, prompt: str | list[int]) -> list[int]:
        """The ids the engine will run for text or ids (its prompt rules: empty -> EOS; PromptError when it can
        never run)."""
        return self.llm.encode_prompt(prompt)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def compile_constraint(self, params: SamplingParams) -> Any:
        """params.structured_outputs compiled (the engine's cache, so adding the request does not compile again);
        GrammarError when it cannot be. Blocks up to [infer] structured_compile_timeout_s."""
        return self.llm.compile_constraint(params)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    async def prompt_logprobs(self, ids: list[int], top_n: int, lora: str | None = None
                              ) -> list[tuple[float | None, list]]:
        """Each prompt token's logprob and top_n alternatives (eval.scoring.prompt_logprobs) by the base model or
        the LoRA adapter `lora`, on the engine thread; KeyError (its message) when that adapter is not loaded."""
        def score(llm: Any) -> list[tuple[float | None, list]]:
            with llm.adapter_forward(lora, len(ids)):
                return prompt_logprobs(llm.model, ids, top_n)
        return await self._on_engine(score)

    async def embed(self, ids: list[int], pooling: str) -> list[float]:
        """One input's embedding (infer/embeddings.py), computed on the engine thread between two steps."""
        return (await self._on_engine(lambda llm: embed(llm.model, [ids], pooling)))[0].tolist()

    async def _on_engine(self, fn: Callable[[Any], Any]) -> Any:
        """fn(LLMEngine) on the engine thread (AsyncEngine.call); a dead loop or a failed model is EngineDead."""
        if not self.is_alive():
            raise EngineDead("engine loop is not running")
        try:
            return await self.engine.call(fn)
        except RuntimeError as e:
            raise EngineDead(str(e)) from None

    # ---------------------------------------------------------------- lifecycle
    def is_alive(self) -> bool:
        return self.engine.is_alive()

    def last_step_age_s(self) -> float:
        """The engine loop's own clock (it marks every pass, steps without output included); 0 when idle."""
        return self.engine.last_step_age_s() if self.engine.num_running else 0.0

    def kill(self, reason: str = "engine loop stopped") -> None:
        """Stop the engine thread: every live sequence fails with EngineDead (what a crash looks like)."""
        for rid, stream in list(self._live.items()):
            stream.queue.put_nowait(EngineDead(reason))
            self.engine.abort(rid)
        self.engine.shutdown()

    def restart(self) -> None:
        self.kill("engine restarted")
        for rid in list(self._live):
            self.llm.abort(rid)  # the old thread is gone: free the blocks from here
        self.engine = AsyncEngine(self.llm)
        self.restarts += 1

    def close(self) -> None:
        """The server stops: abort what it still has in the engine; the engine's owner shuts it down."""
        for rid, stream in list(self._live.items()):
            stream.queue.put_nowait(EngineDead("server stopped"))
            self.engine.abort(rid)

    # ---------------------------------------------------------------- requests
    def stats(self) -> EngineStats:
        used, free = self.engine.num_used_blocks, self.engine.num_free_blocks
        llm = self.llm
        return EngineStats(self.engine.num_running, self.engine.num_waiting, used * self._block_bytes,
                           self.max_num_seqs, kv_blocks_used=used, kv_blocks_free=free,
                           kv_usage=used / max(1, used + free), preemptions=llm.num_preemptions,
                           prefix_cache_hits=llm.prefix_cache_hit_tokens,
                           prefix_cache_queries=llm.prefix_cache_query_tokens,
                           spec_proposed_tokens=llm.spec_proposed_tokens,
                           spec_accepted_tokens=llm.spec_accepted_tokens, ended=dict(self._ended),
                           step_s=self._meter.step_s, prefill_s_per_token=self._meter.prefill_s_per_token)

    def add_step_listener(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Call `listener(StepRecord)` on the engine thread after every step; returns its remover."""
        self.llm.step_listeners.append(listener)
        return lambda: self.llm.step_listeners.remove(listener) if listener in self.llm.step_listeners else None

    def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self.engine.abort(request_id)

    def lora_names(self) -> list[str]:
        return self.llm.lora_names

    async def add_lora(self, name: str, path: str, replace: bool = False) -> None:
        """Load a PEFT adapter on the engine thread (between two steps); ValueError when it does not fit.
        `replace`: a new version of a loaded one (LLMEngine.add_lora)."""
        adapter = await asyncio.to_thread(LoRAAdapter.load, path)  # reading the file off the engine thread
        await self.engine.call(lambda engine: engine.add_lora(name, adapter, replace))

    async def remove_lora(self, name: str) -> None:
        """Unload an adapter on the engine thread; ValueError while a request still runs with it."""
        await self.engine.call(lambda engine: engine.remove_lora(name))

    async def stream(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     on_usage: UsageCallback | None = None, lora: str | None = None) -> AsyncIterator[TokenEvent]:
        def report(usage: SequenceUsage) -> None:
            if usage.finish_reason is not None:  # the engine's final output: the sequence ended there
                self._ended[usage.finish_reason] += 1
            if on_usage is not None:
                on_usage(usage)

        n = len(prompt_ids)
        if not self.is_alive():
            report(_usage(request_id, n, None))
            raise EngineDead("engine loop is not running")
        try:
            stream = self.engine.add_request(request_id, list(prompt_ids), params, lora)
        except (PromptError, AdmissionError, ValueError) as e:  # ValueError: its LoRA adapter was just unloaded
            report(_usage(request_id, n, None))
            raise RequestRejected(str(e)) from None
        self._live[request_id] = stream
        reported = False
        try:
            async for delta in stream:
                if delta.finished:  # before the last tokens: whoever sees the end sees the cost
                    report(_usage(request_id, n, delta.output))
                    reported = True
                for i, tid in enumerate(delta.token_ids):
                    info = delta.logprobs[i] if delta.logprobs and i < len(delta.logprobs) else None
                    top = tuple(sorted(info["top"].items(), key=lambda kv: -kv[1])) if info else ()
                    yield TokenEvent(tid, info["logprob"] if info else None, top)
                if delta.finish_reason == "abort":
                    return
        except BaseException:
            if not reported and stream.finished:  # the engine failed it: no output will come
                report(_usage(request_id, n, None))
                reported = True
            raise
        finally:
            self._live.pop(request_id, None)
            await stream.aclose()
            if not reported:  # left early: the abort's output (with what it cost) comes shortly
                task = asyncio.get_running_loop().create_task(self._drain(stream, request_id, n, report))
                self._drains.add(task)
                task.add_done_callback(self._drains.discard)

    @staticmethod
    async def _drain(stream: Any, request_id: str, prompt_len: int, report: UsageCallback) -> None:
        """Wait for the aborted sequence's last delta and report its usage (empty if none comes)."""
        output = None
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                while True:
                    item = await stream.queue.get()
                    if isinstance(item, BaseException):
                        break
                    if item.finished:
                        output = item.output
                        break
        except TimeoutError:
            pass
        report(_usage(request_id, prompt_len, output))


def make_adapter(engine: Any) -> EngineAdapter:
    """The adapter for `engine`, a tinystack.infer.AsyncEngine (it keeps its own max_num_seqs), or the
    replicas' adapter as it is."""
    if type(engine).__name__ == "ReplicaAdapter":  # by name: serve/replicas imports Ray, which is optional
        return engine
    if not isinstance(engine, AsyncEngine):
        raise TypeError(f"serve needs a tinystack.infer.AsyncEngine, got {type(engine).__name__}")
    return AsyncEngineAdapter(engine)
