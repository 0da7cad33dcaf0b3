"""`AsyncEngineAdapter`: the continuous-batching `tinystack.infer.AsyncEngine` behind the EngineAdapter contract.

    stream(id, prompt_ids, params) -> AsyncEngine.add_request -> RequestStream of TokenDeltas
                                      -> one TokenEvent per new token id
    abort(id)                      -> AsyncEngine.abort (its blocks are freed on the engine thread)
    stats()                        -> num_running / num_waiting / num_used_blocks x bytes per block

Logprobs arrive with the request's final output, not per delta, so a request that
asks for them gets its tokens when it finishes (streaming still works, in one piece).
"Alive" is the engine thread being alive; `restart()` stops it, aborts what this
server had in it, and starts a fresh AsyncEngine over the same LLMEngine (weights
and KV storage are kept).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, AsyncIterator

from tinystack.infer import AsyncEngine
from tinystack.infer.memory import AdmissionError
from tinystack.infer.llm_engine import PromptTooLongError
from tinystack.infer.sampler import SamplingParams
from tinystack.serve.engine_adapter import EngineDead, EngineStats, RequestRejected, TokenEvent


class AsyncEngineAdapter:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.llm = engine.engine
        self.tokenizer = self.llm.tokenizer
        self.max_seq_len: int = int(self.llm.max_seq_len)
        self.max_num_seqs: int = int(getattr(self.llm.scheduler, "max_num_seqs", 0) or
                                     getattr(self.llm.scheduler, "max_batch", 0) or 1)
        self.eos_token_id: int | None = getattr(self.tokenizer, "eos_token_id", None)
        self.restarts = 0
        self._block_bytes = self.llm.storage.nbytes // max(1, self.llm.block_manager.num_blocks)
        self._live: dict[str, Any] = {}  # request id -> RequestStream
        self._last_progress = time.monotonic()

    # ---------------------------------------------------------------- text
    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode_ordinary(text)
        return ids or ([self.eos_token_id] if self.eos_token_id is not None else [0])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ---------------------------------------------------------------- lifecycle
    def is_alive(self) -> bool:
        return self.engine.is_alive()

    def last_step_age_s(self) -> float:
        return time.monotonic() - self._last_progress if self.engine.num_running else 0.0

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
        self._last_progress = time.monotonic()

    def close(self) -> None:
        """The server stops: abort what it still has in the engine; the engine's owner shuts it down."""
        for rid, stream in list(self._live.items()):
            stream.queue.put_nowait(EngineDead("server stopped"))
            self.engine.abort(rid)

    # ---------------------------------------------------------------- requests
    def stats(self) -> EngineStats:
        used = self.engine.num_used_blocks
        return EngineStats(self.engine.num_running, self.engine.num_waiting, used * self._block_bytes,
                           self.max_num_seqs, kv_blocks_used=used, kv_blocks_free=self.engine.num_free_blocks)

    def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self.engine.abort(request_id)

    @staticmethod
    def _timed(event: TokenEvent, delta_or_output: Any) -> TokenEvent:
        """The request's last event carries when the engine scheduled it and its prefill time."""
        output = getattr(delta_or_output, "output", delta_or_output)
        m = getattr(output, "metrics", None)
        if m is None or m.first_scheduled is None:
            return event
        prefill = (m.first_token - m.first_scheduled) if m.first_token is not None else None
        return replace(event, started_at=m.first_scheduled, prefill_s=prefill)

    async def stream(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        if not self.is_alive():
            raise EngineDead("engine loop is not running")
        try:
            stream = self.engine.add_request(request_id, list(prompt_ids), params)
        except (PromptTooLongError, AdmissionError) as e:
            raise RequestRejected(str(e)) from None
        self._live[request_id] = stream
        try:
            async for delta in stream:
                self._last_progress = time.monotonic()
                last = len(delta.token_ids) - 1
                for i, tid in enumerate(delta.token_ids):
                    info = delta.logprobs[i] if delta.logprobs and i < len(delta.logprobs) else None
                    top = tuple(sorted(info["top"].items(), key=lambda kv: -kv[1])) if info else ()
                    event = TokenEvent(tid, info["logprob"] if info else None, top)
                    yield self._timed(event, delta) if i == last else event
                if delta.finish_reason == "abort":
                    return
        finally:
            self._live.pop(request_id, None)
            await stream.aclose()
