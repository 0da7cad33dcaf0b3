"""`ReplicaAdapter`: the EngineAdapter (serve/engine/adapter.py) of the gateway, whose engine is N replicas.

The gateway is the ordinary FastAPI app (serve/app.py) built over this adapter, so validation, auth,
rate limits, errors, streaming and observability are the single-process server's own code. Only
the engine calls change:

    encode / decode            the model's tokenizer, loaded here, with the engine's prompt rules
    stream(id, ids, params)    -> handle.options(stream=True).generate.remote(..., prefix=hashes)
                                  (one handle per event loop, its router on that loop, over Serve's
                                  gRPC transport: _handle_here; Ray Serve routes it with router.py)
                                  -> TokenEvents; the replica that serves it goes into the
                                  request's log fields (`replica`), which the middleware also
                                  sends as the x-tinystack-replica header
        replica died / went away before the first token   -> sent again (another replica), up to
                                                              `retries` times: nothing was lost
        ... after tokens were sent                         -> ReplicaLost: 503, or in a stream an
                                                              error event (engine/execution.py); the
                                                              breaker is not told (one replica)
        every replica full (Serve's queue bound)           -> EngineBusy: 429 with Retry-After
    abort(id)                  closing the stream cancels the call; the replica aborts the sequence
    stats(), replica_stats()   summed / per replica, from the replicas' routing stats (router.py)
    is_alive()                 at least one replica is up; Ray Serve replaces dead ones itself,
                               so restart() only counts (the watchdog calls it when none is up)
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from tinystack.infer.llm_engine import LLMEngine
from tinystack.infer.structured import compile_grammar
from tinystack.observe.usage import SequenceUsage
from tinystack.sampling_params import SamplingParams
from tinystack.serve.api.context import current_context
from tinystack.serve.engine.adapter import (
    EngineBusy,
    EngineDead,
    EngineStats,
    ReplicaLost,
    RequestRejected,
    TokenEvent,
    UsageCallback,
)
from tinystack.serve.replicas.registry import live_routers
from tinystack.serve.replicas.routing import prompt_block_hashes
from tinystack.tokenizer import load_tokenizer

logger = logging.getLogger("tinystack.serve")
RETRY_PAUSE_S = 0.2  # before sending a request again: Serve needs a moment to drop a dead replica


def _lost_replica(e: BaseException) -> bool:
    """The replica died or is unreachable (as opposed to an error in our own code on it)."""
    import grpc
    from ray.exceptions import ActorUnavailableError, RayActorError

    # on the gRPC path a replica gone before the call is ActorUnavailableError; one lost under a running
    # stream can surface as the transport's own error (our code's errors on the replica come back as themselves)
    return isinstance(e, (RayActorError, ActorUnavailableError, grpc.aio.AioRpcError))



def _slowest(per: Any, key: str) -> float | None:
    """The slowest replica's measured speed (a request may land on any of them); None before any measured."""
    return max((s[key] for s in per if s.get(key) is not None), default=None)

class ReplicaAdapter:
    def __init__(self, handle: Any, model_dir: str | Path, *, replicas: int, app_name: str,
                 compile_timeout_s: float, retries: int = 3) -> None:
        """`compile_timeout_s`: [infer] structured_compile_timeout_s (deploy.gateway_adapter passes it)."""
        self.handle = handle
        self._streaming: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self.app_name = app_name
        self.replicas = replicas
        self.retries = retries
        self.compile_timeout_s = compile_timeout_s
        self.tokenizer = load_tokenizer(model_dir)
        self.eos_token_id: int | None = getattr(self.tokenizer, "eos_token_id", None)
        info = handle.info.remote().result(timeout_s=120)  # also starts this handle's router
        self.max_seq_len: int = int(info["max_seq_len"])
        self.block_size: int = int(info["block_size"])
        self.max_num_seqs: int = int(info["max_num_seqs"]) * replicas  # the gate's share: all replicas
        self.loras: list[str] = list(info["loras"])  # every replica loads [serve] lora_modules at its start
        self.lora_errors: dict[str, str] = dict(info["lora_errors"])
        self.restarts = 0
        self.resent = 0  # requests sent again after their replica was lost
        self.cut = 0  # streams cut by a lost replica

    # ---------------------------------------------------------------- text
    def encode(self, prompt: str | list[int]) -> list[int]:
        # the engine's prompt rules live on LLMEngine.encode_prompt; it needs only .tokenizer and .max_seq_len
        return LLMEngine.encode_prompt(self, prompt)  # type: ignore[arg-type]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def compile_constraint(self, params: SamplingParams) -> Any:
        """Checked at the gateway with its own copy of the tokenizer, so a bad constraint is a 400 before any
        replica is asked (each replica compiles it again, into its own cache)."""
        return compile_grammar(params.structured_outputs, self.tokenizer, self.compile_timeout_s)

    # ---------------------------------------------------------------- replicas
    def replica_stats(self) -> dict[str, dict[str, Any]]:
        """Replica id -> its routing stats, for every replica up (as this gateway's router sees them)."""
        out: dict[str, dict[str, Any]] = {}
        for router in live_routers():
            loop = getattr(router, "_lazily_fetched_loop", None)  # a gateway loop's router outlives its server
            if router.app_name == self.app_name and not (loop is not None and loop.is_closed()):
                out.update(router.replica_stats())
        return out

    def replicas_up(self) -> int:
        return sum(1 for s in self.replica_stats().values() if s.get("alive", True))

    def stats(self) -> EngineStats:
        per = self.replica_stats().values()
        ended: dict[str, int] = {}
        for s in per:
            for k, v in (s.get("ended") or {}).items():
                ended[k] = ended.get(k, 0) + v
        used = [s.get("kv_usage", 0.0) for s in per]
        return EngineStats(sum(s.get("running", 0) for s in per), sum(s.get("waiting", 0) for s in per),
                           sum(s.get("kv_bytes_in_use", 0) for s in per), self.max_num_seqs,
                           kv_usage=sum(used) / max(1, len(used)),
                           preemptions=sum(s.get("preemptions", 0) for s in per),
                           prefix_cache_hits=sum(s.get("prefix_cache_hits", 0) for s in per),
                           prefix_cache_queries=sum(s.get("prefix_cache_queries", 0) for s in per),
                           spec_proposed_tokens=sum(s.get("spec_proposed_tokens", 0) for s in per),
                           spec_accepted_tokens=sum(s.get("spec_accepted_tokens", 0) for s in per), ended=ended,
                           step_s=_slowest(per, "step_s"), prefill_s_per_token=_slowest(per, "prefill_s_per_token"))

    # ---------------------------------------------------------------- lifecycle
    def is_alive(self) -> bool:
        return self.replicas_up() > 0

    def last_step_age_s(self) -> float:
        return 0.0  # each replica's engine is watched by Serve's health check (replica.check_health)

    def add_step_listener(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        return lambda: None  # engine steps happen in the replicas (their batch sizes are not seen here)

    def kill(self, reason: str = "") -> None:
        """Nothing to stop here: the replicas belong to Ray Serve."""

    def restart(self) -> None:
        self.restarts += 1  # Ray Serve replaces dead replicas; the watchdog's call is only counted

    def close(self) -> None:
        """The gateway stops; the replicas keep running until the deployment is deleted (deploy.py)."""

    async def embed(self, ids: list[int], pooling: str) -> list[float]:
        """One input's embedding on a replica Serve picks; a lost replica is EngineDead (a 503)."""
        return await self._call("embed", list(ids), pooling)

    async def prompt_logprobs(self, ids: list[int], top_n: int, lora: str | None = None
                              ) -> list[tuple[float | None, list]]:
        return await self._call("prompt_logprobs", list(ids), top_n, lora)

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.handle, method).remote(*args)
        except Exception as e:
            if isinstance(e, EngineDead) or _lost_replica(e):
                raise EngineDead(f"no replica could answer: {e}") from None
            raise

    def abort(self, request_id: str) -> None:
        """Closing the stream (the generation's finally does) cancels the call on the replica."""

    # ---------------------------------------------------------------- requests
    def _handle_here(self) -> Any:
        """The streaming handle for this event loop (made once per loop: options() builds a new handle).

        Two choices, each measured on the shared 2-core machine under load (benchmarks/bench_replicas.py
        --overhead-only and same-run probes): its router runs on this loop (Serve's default is a router thread
        of its own: every call and every message would cross threads), and
        `_by_reference=False` is Serve's gRPC path straight to the replica's inter-deployment server rather
        than a Ray actor call with an ObjectRef per message (slower per message). Routing, health checks and replacement
        stay Serve's; only the transport changes.
        """
        loop = asyncio.get_running_loop()
        handle = self._streaming.get(loop)
        if handle is None:
            from ray.serve.handle import DeploymentHandle

            # a fresh handle (serve.get_deployment_handle gives a cached, maybe initialised one): a router each
            base = DeploymentHandle(self.handle.deployment_name, self.handle.app_name)
            base._init(_run_router_in_separate_loop=False)
            handle = self._streaming[loop] = base.options(stream=True, _by_reference=False)
        return handle

    def lora_names(self) -> list[str]:
        return list(self.loras)

    async def add_lora(self, name: str, path: str, replace: bool = False) -> None:
        """The replicas loaded [serve] lora_modules at their start (a replaced or rolled one does too): this only
        confirms `name` is among them, or raises the ValueError its replica met (the server's start stops on
        it). Loading another at run time would leave the replicas Serve starts later without it: refused."""
        if replace:
            raise NotImplementedError("through replicas, a new adapter version comes with a rolling update")
        if name in self.lora_errors:
            raise ValueError(self.lora_errors[name])
        if name not in self.loras:
            raise NotImplementedError("through replicas, LoRA adapters are loaded at start only: list it in "
                                      "serve.lora_modules (the rolling update loads it everywhere)")

    async def remove_lora(self, name: str) -> None:
        raise NotImplementedError("through replicas, LoRA adapters are unloaded by a rolling update without it "
                                  "in serve.lora_modules")

    async def stream(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     on_usage: UsageCallback | None = None, lora: str | None = None) -> AsyncIterator[TokenEvent]:
        from ray.serve.exceptions import BackPressureError

        hashes = prompt_block_hashes(prompt_ids, self.block_size)
        sent_tokens = 0
        usage: SequenceUsage | None = None
        try:
            for attempt in range(self.retries + 1):
                call = self._handle_here().generate.remote(request_id, list(prompt_ids), params, prefix=hashes,
                                                           lora=lora)
                ended = False
                try:
                    async for batch in call:
                        for item in batch:
                            if isinstance(item, TokenEvent):
                                sent_tokens += 1
                                yield item
                            elif isinstance(item, SequenceUsage):
                                usage = item
                            elif item[0] == "replica":
                                _note_replica(item[1])
                            elif item[0] == "rejected":
                                raise RequestRejected(item[1])
                            elif item[0] == "dead":
                                raise EngineDead(item[1])
                    ended = True
                    return
                except BackPressureError:
                    raise EngineBusy("every replica is at capacity") from None
                except (EngineDead, Exception) as e:
                    if not (isinstance(e, EngineDead) or _lost_replica(e)):
                        raise
                    if sent_tokens:
                        self.cut += 1
                        raise ReplicaLost(f"the replica serving this request was lost: {e}") from None
                    if attempt == self.retries:
                        raise EngineDead(f"no replica could serve this request: {e}") from None
                    self.resent += 1
                    logger.warning("replica lost before the first token of %s; sending it again", request_id)
                    await asyncio.sleep(RETRY_PAUSE_S)
                finally:
                    if not ended:  # left early: the replica aborts the sequence (after a normal end there is
                        call.cancel()  # nothing to cancel, yet Serve's cancel() would still resolve and cancel it)
        finally:
            if on_usage is not None:
                on_usage(usage or SequenceUsage(request_id, len(prompt_ids), sent_tokens, None))


def _note_replica(replica_id: str) -> None:
    """Put the serving replica in the request's log fields (the middleware sends it as a header)."""
    ctx = current_context()
    if ctx is None:
        return
    seen = ctx.fields.get("replica")
    if not seen:
        ctx.fields["replica"] = replica_id
    elif replica_id not in seen.split(","):
        ctx.fields["replica"] = f"{seen},{replica_id}"
