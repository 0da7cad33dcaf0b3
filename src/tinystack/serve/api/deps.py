"""FastAPI dependencies: the running server's state, the API key check, the caller's identity, /generate's checks.

    get_state        the ServerState of the running server (503 outside its lifespan)
    authenticate     the app's one API key check (401), a dependency of the app's root router (app.py), so it
                     runs for every route, including one added later on any router; only the routes on
                     OPEN_ROUTES (always) and PROBE_ROUTES (when cfg.open_health) are let through without a key
    caller           the caller's id for rate limits and cost, as `authenticate` found it: the key's hash
                     prefix, or "anonymous" when authentication is off (a route asks for it, not for a check)
    validated_request  GenerateRequest -> Prepared (requests.prepare; numbers in every message; its
                     structured_outputs compiled, structured.py)
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tinystack.serve.api.context import RequestContext, get_context, request_context
from tinystack.serve.api.errors import AUTH_ERROR, SERVER_ERROR, ApiError
from tinystack.serve.api.requests import Prepared, body_sampling, prepare
from tinystack.serve.api.schemas import GenerateRequest
from tinystack.serve.api.structured import check_constraint, from_structured_outputs
from tinystack.serve.state import ServerState


async def get_state(request: Request) -> ServerState:
    state = getattr(request.app.state, "server", None)
    if state is None:
        raise ApiError(503, "server is not running (starting up or shutting down)", "not_running", SERVER_ERROR)
    return state


State = Annotated[ServerState, Depends(get_state)]
Context = Annotated[RequestContext, Depends(request_context)]


# The routes served without a key, by path. The browser pages and their scripts hold no data (the calls they
# make carry the key typed into the page); FastAPI's /openapi.json and /docs describe the API (they are plain
# Starlette routes: no dependency could guard them anyway).
OPEN_ROUTES = frozenset({"/", "/dashboard", "/ui/{name}", "/openapi.json", "/docs", "/docs/oauth2-redirect",
                         "/redoc"})
# Probes for load balancers and Prometheus, which hold no key: open unless cfg.open_health is false.
PROBE_ROUTES = frozenset({"/health", "/ready", "/metrics", "/metrics.json"})


# The admin routes check their own keys ([serve] admin_key_env: require_admin), not the API keys.
ADMIN_ROUTES = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})


async def require_admin(request: Request, state: State) -> None:
    """403 when no admin key is configured (the routes are off), 401 without a valid one."""
    if not state.admin.enabled:
        raise ApiError(403, f"the admin routes are off: set admin keys in ${state.cfg.admin_key_env}",
                       "admin_routes_off", AUTH_ERROR)
    if state.admin.identify(request.headers.get("authorization")) is None:
        raise ApiError(401, "missing or invalid admin key (send Authorization: Bearer <admin key>)",
                       "invalid_api_key", AUTH_ERROR, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(request: Request) -> None:
    """401 unless the request carries a valid key (when keys are configured) or its route is open; the key's id
    goes to the request's context (log line, cost metrics, rate limits: `caller`)."""
    route = request.scope.get("route")
    path = getattr(route, "path", None)
    if path in OPEN_ROUTES or path in ADMIN_ROUTES:  # before get_state: the pages load while the server starts
        return
    state = await get_state(request)
    if not state.keys.enabled or (path in PROBE_ROUTES and state.cfg.open_health):
        return
    who = state.keys.identify(request.headers.get("authorization"))
    if who is None:
        raise ApiError(401, "missing or invalid API key (send Authorization: Bearer <key>)", "invalid_api_key",
                       AUTH_ERROR, headers={"WWW-Authenticate": "Bearer"})
    ctx = get_context(request)
    if ctx is not None:
        ctx.key_id = who  # the key hash's first 12 hex digits: in the log line and cost metrics, never the key


async def caller(ctx: Context) -> str:
    """The caller's id (`authenticate` ran first: it is the app's dependency): for rate limits."""
    return ctx.key_id


Caller = Annotated[str, Depends(caller)]


def validated_request(body: GenerateRequest, state: State, ctx: Context) -> Prepared:
    """A /generate body that passed every check (a plain def: FastAPI runs it off the event loop)."""
    try:
        so = from_structured_outputs(body.structured_outputs) if body.structured_outputs is not None else None
        prep = prepare(state, body.prompt,
                       max_tokens=body.max_tokens if "max_tokens" in body.model_fields_set else None,
                       structured_outputs=so, **body_sampling(state, body))
        check_constraint(state, prep.params, "structured_outputs")  # may block: this runs in a worker thread
    except ApiError as e:  # /generate keeps the foundation's 422 for a field out of range
        if e.status == 400 and e.code == "invalid_value":
            e.status, e.code = 422, "validation_error"
        raise
    ctx.fields["prompt_tokens"] = len(prep.prompt_ids)
    ctx.timing.mark_clamped("validated")
    return prep


Validated = Annotated[Prepared, Depends(validated_request)]
