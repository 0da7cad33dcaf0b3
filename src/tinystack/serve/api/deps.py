"""FastAPI dependencies: the running server's state, the caller's identity, and /generate's checks.

    get_state        the ServerState of the running server (503 outside its lifespan)
    caller           API key check (401) -> the caller's id for rate limits: the key's hash
                     prefix, or "anonymous" when authentication is off
    validated_request  GenerateRequest -> Prepared (requests.prepare; numbers in every message)
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tinystack.serve.api.context import RequestContext, request_context
from tinystack.serve.api.errors import AUTH_ERROR, SERVER_ERROR, ApiError
from tinystack.serve.api.requests import Prepared, prepare, with_model_defaults
from tinystack.serve.api.schemas import GenerateRequest
from tinystack.serve.state import ServerState


async def get_state(request: Request) -> ServerState:
    state = getattr(request.app.state, "server", None)
    if state is None:
        raise ApiError(503, "server is not running (starting up or shutting down)", "not_running", SERVER_ERROR)
    return state


State = Annotated[ServerState, Depends(get_state)]
Context = Annotated[RequestContext, Depends(request_context)]


async def caller(request: Request, state: State, ctx: Context) -> str:
    """401 unless the request carries a valid key (when keys are configured)."""
    if not state.keys.enabled:
        return "anonymous"
    who = state.keys.identify(request.headers.get("authorization"))
    if who is None:
        raise ApiError(401, "missing or invalid API key (send Authorization: Bearer <key>)", "invalid_api_key",
                       AUTH_ERROR, headers={"WWW-Authenticate": "Bearer"})
    ctx.key_id = who  # the key hash's first 12 hex digits: in the log line and cost metrics, never the key
    return who


async def open_or_caller(request: Request, state: State, ctx: Context) -> None:
    """Health-type endpoints: open when cfg.open_health, else the same check as `caller`."""
    if not state.cfg.open_health:
        await caller(request, state, ctx)


Caller = Annotated[str, Depends(caller)]


def validated_request(body: GenerateRequest, state: State, ctx: Context) -> Prepared:
    """A /generate body that passed every check (a plain def: FastAPI runs it off the event loop)."""
    try:
        prep = prepare(state, body.prompt,
                       max_tokens=body.max_tokens if "max_tokens" in body.model_fields_set else None,
                       seed=body.seed, **with_model_defaults(state, body, temperature=body.temperature,
                                                             top_k=body.top_k, top_p=body.top_p))
    except ApiError as e:  # /generate keeps the foundation's 422 for a field out of range
        if e.status == 400 and e.code == "invalid_value":
            e.status, e.code = 422, "validation_error"
        raise
    ctx.fields["prompt_tokens"] = len(prep.prompt_ids)
    ctx.timing.mark_clamped("validated")
    return prep


Validated = Annotated[Prepared, Depends(validated_request)]
