"""Pure ASGI middleware around every HTTP request: id, arrival time, last-resort 500, one log line.

    request in  -> RequestContext(request_id from x-request-id or uuid4 hex, RequestTiming)
                   timing.mark("arrival"); context stored in scope["state"]
    app runs    -> routes / error handlers fill ctx.fields and mark the other points
    response    -> x-request-id header added; "returned" marked if nobody did
    unhandled   -> generic 500 body (traceback to the `tinystack.serve` logger)
    after send  -> request_log.log("request", request_id, status, method, path, <ctx.fields>, <timing>)

Pure ASGI (not `@app.middleware("http")`/BaseHTTPMiddleware) so it adds no extra
task or body buffering, and so it can see and answer exceptions nothing else handled
while still adding the header and writing the log line.
"""
from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tinystack.observe.logs import RequestLog
from tinystack.observe.timing import RequestTiming
from tinystack.serve.context import REQUEST_ID_HEADER, STATE_KEY, RequestContext, new_request_id
from tinystack.serve.errors import unexpected_error_response


class RequestContextMiddleware:
    """Wraps the app; `request_log` may be None (no log lines)."""

    def __init__(self, app: ASGIApp, request_log: RequestLog | None = None) -> None:
        self.app = app
        self.request_log = request_log

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
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                ctx.mark_returned()
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = ctx.request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:  # nothing below handled it: answer 500 if we still can
            if status is not None:
                raise  # the response already started; uvicorn will close the connection
            response = unexpected_error_response(Request(scope), exc)
            await response(scope, receive, send_with_id)
        finally:
            self._log(scope, ctx, status)

    def _log(self, scope: Scope, ctx: RequestContext, status: int | None) -> None:
        if self.request_log is None:
            return
        fields = {"method": scope.get("method"), "path": scope.get("path"), **ctx.fields, **ctx.timing.to_dict()}
        fields.pop("request_id", None)
        fields.pop("status", None)
        self.request_log.log("request", request_id=ctx.request_id, status=status, **fields)
