"""Pure ASGI middleware around every HTTP request: id, timing, last-resort 500, timing headers, observability.

    request in  -> RequestContext(request_id from x-request-id or uuid4 hex, RequestTiming)
                   timing.mark("arrival"); context stored in scope["state"]
    app runs    -> routes / error handlers fill ctx (fields, usage, finish reasons) and mark points
    response    -> x-request-id (+ x-tinystack-replica behind replicas) + timing headers (seconds, decimal strings):
                     x-queue-time, x-inference-time, x-time-to-first-token, x-total-time, x-cost-usd
                   whole answers: "returned" is marked here and every known header is sent;
                   streams (text/event-stream): headers go out with the first token, so only
                   x-time-to-first-token (set by the route) is known; the full timing is in the
                   final chunk's `timing` object, and "returned" is marked at the last body byte
    unhandled   -> generic 500 body (traceback to the `tinystack.serve` logger)
    cancelled   -> uvicorn cancels what is left when a stopping server's time is up: a 503
                   server_shutting_down if nothing was sent yet, an error event and [DONE] if a
                   stream was cut (the last resort: the grace period's own cut, state.cut, comes first)
    after send  -> observer.finish(ctx): metrics, the JSON log line, spans, cost (observe/observer.py)

Pure ASGI (not `@app.middleware("http")`/BaseHTTPMiddleware) so it adds no extra
task or body buffering, and so it can see and answer exceptions nothing else handled
while still adding the headers and recording the request.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import suppress

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tinystack.observe.cost import cost_usd
from tinystack.observe.observer import Observer
from tinystack.observe.timing import RequestTiming
from tinystack.serve.api.context import (
    REQUEST_ID_HEADER,
    STATE_KEY,
    RequestContext,
    new_request_id,
    set_current_context,
)
from tinystack.serve.api.errors import SERVER_ERROR, error_body, unexpected_error_response

GENERATION_ROUTES = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
REPLICA_HEADER = "x-tinystack-replica"
TIMING_HEADERS = {"x-queue-time": "queue_ms", "x-inference-time": "inference_ms",
                  "x-time-to-first-token": "ttft_ms", "x-total-time": "total_ms"}


def timing_headers(ctx: RequestContext, price_per_device_hour: float) -> dict[str, str]:
    """The timing headers known now (seconds, 6 decimals), and x-cost-usd when the engine cost is known."""
    out = {}
    for header, name in TIMING_HEADERS.items():
        seconds = ctx.timing.seconds(name)
        if seconds is not None:
            out[header] = f"{seconds:.6f}"
    if ctx.usage is not None and ctx.usage.settled and ctx.usage.sequences:
        out["x-cost-usd"] = f"{cost_usd(ctx.usage.device_s, price_per_device_hour):.10g}"
    return out


class RequestContextMiddleware:
    """Wraps the app; `observer` records each finished request (None: nothing recorded)."""

    def __init__(self, app: ASGIApp, observer: Observer | None = None) -> None:
        self.app = app
        self.observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timing = RequestTiming()
        timing.mark("arrival")
        incoming = None
        for name, value in scope.get("headers", ()):
            if name == REQUEST_ID_HEADER.encode("latin-1"):
                incoming = value.decode("latin-1")
                break
        ctx = RequestContext(new_request_id(incoming), timing)
        scope.setdefault("state", {})[STATE_KEY] = ctx
        set_current_context(ctx)
        streaming = False
        price = self.observer.price if self.observer is not None else 0.0

        async def send_with_id(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                ctx.status = int(message["status"])
                headers = MutableHeaders(scope=message)
                streaming = headers.get("content-type", "").startswith("text/event-stream")
                if not streaming:
                    ctx.mark_returned()
                    for key, value in timing_headers(ctx, price).items():
                        headers[key] = value
                headers[REQUEST_ID_HEADER] = ctx.request_id
                if ctx.fields.get("replica"):  # served by replicas (serve/replicas): which one(s)
                    headers[REPLICA_HEADER] = ctx.fields["replica"]
            elif message["type"] == "http.response.body" and streaming and not message.get("more_body", False):
                ctx.mark_returned()
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:  # nothing below handled it: answer 500 if we still can
            if ctx.status is not None:
                raise  # the response already started; uvicorn will close the connection
            response = unexpected_error_response(Request(scope), exc)
            await response(scope, receive, send_with_id)
        except asyncio.CancelledError:
            with suppress(Exception):  # the client may be gone as well
                await _answer_stopped(ctx, streaming, send_with_id)
            raise
        finally:
            self._finish(scope, ctx)

    def _finish(self, scope: Scope, ctx: RequestContext) -> None:
        route = getattr(scope.get("route"), "path", None)
        ctx.route = route or "other"
        ctx.generation = ctx.route in GENERATION_ROUTES
        ctx.fields = {"method": scope.get("method"), "path": scope.get("path"), **ctx.fields}
        if not ctx.timing.is_marked("returned"):
            ctx.mark_returned()
        if self.observer is not None:
            self.observer.finish(ctx)


STOPPED = error_body("the server stopped before this request finished; retry on another instance", SERVER_ERROR,
                     "server_shutting_down")


async def _answer_stopped(ctx: RequestContext, streaming: bool, send: Send) -> None:
    """The request's task was cancelled (the server stops): tell the client, if the answer is still open."""
    ctx.failure = "aborted"
    ctx.fields.setdefault("error_code", "server_shutting_down")
    if ctx.status is None:
        body = json.dumps(STOPPED).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", b"1"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    elif streaming and not ctx.timing.is_marked("returned"):
        events = b"data: " + json.dumps(STOPPED).encode() + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": events, "more_body": False})
