"""What the native routes do, kept out of the route functions: /generate, /health, /ready, /v1/models.

    POST /generate: Prepared -> execution.run (protections, engine) -> GenerateResponse
        timing (engine/tracking.py): enqueued before admission, scheduled / first_token / last_token
        from the engine's stamps, returned when the answer is built (tinystack.observe)
"""
from __future__ import annotations

from typing import Any

from tinystack.serve.api.context import RequestContext
from tinystack.serve.api.requests import Prepared
from tinystack.serve.api.schemas import GenerateResponse, HealthResponse, Timing
from tinystack.serve.engine.execution import Fallback, run
from tinystack.serve.engine.tracking import RequestTracker, timing_body
from tinystack.serve.state import ServerState


async def generate(state: ServerState, prep: Prepared, ctx: RequestContext) -> GenerateResponse:
    """Run one /generate request; records counts and finish_reason for the log line."""
    ctx.fields["prompt"] = prep.prompt  # dropped by RequestLog unless it was set up with include_text
    tracker = RequestTracker(ctx)
    tracker.enqueued()
    text, tokens, finish, degraded = "", [], "length", False
    try:
        async for item in run(state, prep, tracker.usage):
            tracker.see(item)
            if isinstance(item, Fallback):
                text, tokens, finish, degraded = item.text, [], "stop", True
                break
            text += item.text
            tokens.extend(ev.token_id for ev in item.tokens)
            finish = item.finish_reason or finish
    finally:
        tracker.done()
    ctx.fields.update(completion_tokens=len(tokens), finish_reason=finish, text=text, degraded=degraded)
    ctx.finish_reasons = [finish]
    ctx.mark_returned()
    return GenerateResponse(text=text, tokens=tokens, prompt_tokens=len(prep.prompt_ids),
                            completion_tokens=len(tokens), finish_reason=finish, degraded=degraded,
                            timing=Timing.model_validate(timing_body(ctx, state.cfg.price_per_device_hour)))


def health(state: ServerState) -> tuple[HealthResponse, int]:
    """Liveness of the engine loop plus load; status 503 when the loop is dead or stalled."""
    a, s = state.adapter, state.adapter.stats()
    age = a.last_step_age_s()
    status = "dead" if not a.is_alive() else ("stalled" if age > state.cfg.stall_timeout_s else "ok")
    body = HealthResponse(status=status, engine_alive=a.is_alive(), last_step_age_s=round(age, 3), running=s.running,
                          waiting=s.waiting, in_flight=state.gate.in_flight, capacity=state.gate.capacity,
                          kv_bytes_in_use=s.kv_bytes_in_use, breaker=state.breaker.state,
                          engine_restarts=a.restarts, max_num_seqs=s.max_num_seqs, max_seq_len=a.max_seq_len,
                          draining=state.draining)
    if hasattr(a, "replicas_up"):  # behind the gateway: Ray Serve replaces lost replicas; say how many are up
        body.replicas_up, body.replicas_total = a.replicas_up(), a.replicas
    return body, 200 if status == "ok" else 503


def ready(state: ServerState) -> tuple[dict[str, Any], int]:
    """Model loaded and not draining."""
    if state.draining:
        return {"status": "draining"}, 503
    if not state.adapter.is_alive():
        return {"status": "engine_down"}, 503
    return {"status": "ready", "model": state.model_name}, 200


def models(state: ServerState) -> dict[str, Any]:
    base = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "tinystack",
            "max_model_len": state.adapter.max_seq_len, "lineage": state.lineage}
    adapters = [{"id": name, "object": "model", "created": state.created, "owned_by": "tinystack",
                 "max_model_len": state.adapter.max_seq_len, "parent": state.model_name, "root": name}
                for name in state.adapter.lora_names()]  # LoRA adapters over the base (vLLM's shape)
    return {"object": "list", "data": [base, *adapters]}
