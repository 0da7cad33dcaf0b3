"""Per-request context: the request id, its timing, and the fields of its log line.

Created by `RequestContextMiddleware` when a request arrives and stored in the ASGI
scope's state, so dependencies, routes and error handlers can all reach it
(`get_context(request)` or `Depends(request_context)`), and the middleware hands it
to the app's Observer (log line, metrics, traces, cost) once the response is sent.
"""
from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

from starlette.requests import Request

from tinystack.observe.record import RequestRecord

REQUEST_ID_HEADER = "x-request-id"
STATE_KEY = "tinystack_ctx"
# An incoming x-request-id is honoured only if it is short and plain (it goes into logs and headers).
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_request_id(incoming: str | None = None) -> str:
    """`incoming` if it is a plain id (<= 128 chars of [A-Za-z0-9._:-]), else a fresh uuid4 hex."""
    if incoming is not None and _VALID_REQUEST_ID.fullmatch(incoming):
        return incoming
    return uuid.uuid4().hex


class RequestContext(RequestRecord):
    """What the server knows about one request (tinystack.observe.RequestRecord: id, timing, log
    fields, engine usage, key id, route); the Observer records it once the response is sent."""


# The request being served, for code below the routes that has no Request (the replicas' adapter names the
# replica that served it); set by the middleware in the request's own task, inherited by the tasks it starts.
_CURRENT: ContextVar[RequestContext | None] = ContextVar("tinystack_request_context", default=None)


def current_context() -> RequestContext | None:
    return _CURRENT.get()


def set_current_context(ctx: RequestContext) -> None:
    _CURRENT.set(ctx)


def get_context(request: Request) -> RequestContext | None:
    """The context the middleware attached, or None (app used without the middleware)."""
    ctx = request.scope.get("state", {}).get(STATE_KEY)
    return ctx if isinstance(ctx, RequestContext) else None


async def request_context(request: Request) -> RequestContext:
    """FastAPI dependency (async: no thread hop): this request's context; raises if the middleware is missing."""
    ctx = get_context(request)
    if ctx is None:
        raise RuntimeError("RequestContextMiddleware is not installed")
    return ctx
