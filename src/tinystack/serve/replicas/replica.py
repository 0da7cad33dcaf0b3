"""`EngineReplica`: one engine replica, the class Ray Serve deploys N times (deploy.py).

Each replica loads its own AsyncEngine from the model directory and the [infer] settings (its own
KV cache and memory budget) and serves it through the same `AsyncEngineAdapter` the single-process
server uses. It speaks to the gateway (adapter.py) in plain picklable items:

    generate(request_id, prompt_ids, params, prefix=, lora=)   async generator (Serve streaming) of lists of:
        ("replica", id)        first, so the gateway knows who serves it before any token
        TokenEvent ...         one per generated token
        SequenceUsage          last: tokens, finish reason, engine stamps and cost
        ("rejected", msg)      the engine refuses the request for good (the gateway's 400)
        ("dead", msg)          the engine loop is not running (the gateway retries elsewhere)
      one list per token, the first and last items riding with the first and last token: every item
      sent costs a Ray round of its own, and a short request is then one or two of them
      `prefix` is the router's hint (router.py reads it); the replica ignores it.
    record_routing_stats()     Serve polls it: load (queued + running), KV use, prefix-cache counters,
                               finished sequences, and the hashes of the blocks in its prefix cache
    check_health()             Serve's health check: raises when the engine loop died, so Serve
                               replaces the replica
    info()                     what the gateway must know to validate requests (context, batch size, the
                               LoRA adapters loaded, and why any of [serve] lora_modules was not)

Cancelling the generator (the client went away, the gateway gave up) aborts the sequence in the engine.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import torch

from tinystack.config import InferConfig
from tinystack.observe.usage import SequenceUsage
from tinystack.sampling_params import SamplingParams
from tinystack.serve.engine.adapter import EngineDead, RequestRejected, load_engine
from tinystack.serve.engine.async_adapter import AsyncEngineAdapter

MAX_REPORTED_BLOCKS = 8192  # cached block hashes sent with the routing stats (bounded: they travel often)


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (unit use): one anonymous replica
        return "local"


class EngineReplica:
    def __init__(self, model_dir: str, infer: dict[str, Any], device: str = "cpu", threads: int = 0,
                 loras: tuple[tuple[str, str], ...] = ()) -> None:
        if threads > 0:  # Ray reserves `threads` CPUs for this replica; torch must not use every core

            torch.set_num_threads(threads)
        self.model_dir = model_dir
        self.engine = load_engine(model_dir, InferConfig(**infer), device)
        self.adapter = AsyncEngineAdapter(self.engine)
        self.replica_id = _replica_id()
        self.lora_errors: dict[str, str] = {}  # [serve] lora_modules that did not load: the gateway refuses to start
        for name, path in loras:  # before any request can reach this replica (its engine loop is idle)
            try:
                self.engine.engine.add_lora(name, path)
            except (ValueError, OSError) as e:
                self.lora_errors[name] = str(e)

    def info(self) -> dict[str, Any]:
        manager = getattr(self.adapter.llm, "block_manager", None)
        return {"replica": self.replica_id, "model_dir": self.model_dir, "max_seq_len": self.adapter.max_seq_len,
                "max_num_seqs": self.adapter.max_num_seqs, "block_size": int(getattr(manager, "block_size", 16)),
                "loras": self.adapter.lora_names(), "lora_errors": self.lora_errors}

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                       prefix: list[int] | None = None, lora: str | None = None) -> AsyncIterator[Any]:
        batch: list[Any] = [("replica", self.replica_id)]
        usage: list[SequenceUsage] = []
        try:
            async for event in self.adapter.stream(request_id, prompt_ids, params, usage.append, lora):
                batch.append(event)
                if usage:  # reported before the last token: it travels with it
                    batch.append(usage.pop())
                yield batch
                batch = []
        except RequestRejected as e:
            batch.append(("rejected", str(e)))
        except EngineDead as e:
            batch.append(("dead", str(e)))
        batch.extend(usage)
        if batch:
            yield batch

    async def embed(self, ids: list[int], pooling: str) -> list[float]:
        return await self.adapter.embed(ids, pooling)

    async def prompt_logprobs(self, ids: list[int], top_n: int, lora: str | None = None
                              ) -> list[tuple[float | None, list]]:
        return await self.adapter.prompt_logprobs(ids, top_n, lora)

    def record_routing_stats(self) -> dict[str, Any]:
        s = self.adapter.stats()
        by_hash = getattr(getattr(self.adapter.llm, "block_manager", None), "by_hash", None) or {}
        for _ in range(3):  # the engine thread may change the dict while we copy it: copy again
            try:
                cached = list(by_hash)[-MAX_REPORTED_BLOCKS:]
                break
            except RuntimeError:
                cached = []
        return {"replica": self.replica_id, "load": s.running + s.waiting, "running": s.running,
                "waiting": s.waiting, "kv_usage": s.kv_usage, "kv_bytes_in_use": s.kv_bytes_in_use,
                "max_num_seqs": s.max_num_seqs, "preemptions": s.preemptions,
                "prefix_cache_hits": s.prefix_cache_hits, "prefix_cache_queries": s.prefix_cache_queries,
                "spec_proposed_tokens": s.spec_proposed_tokens, "spec_accepted_tokens": s.spec_accepted_tokens,
                "ended": dict(s.ended), "alive": self.adapter.is_alive(), "cached": cached,
                "step_s": s.step_s, "prefill_s_per_token": s.prefill_s_per_token}  # the gateway's time limits

    def check_health(self) -> None:
        if not self.adapter.is_alive():
            raise RuntimeError("the engine loop is not running")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            self.adapter.close()
            engine.shutdown()
