"""Pure ASGI middleware: request bodies over `max_bytes` are refused with 413 before they are read whole.

A declared Content-Length over the limit is answered at once; a body without one
(chunked) is counted as it arrives and cut off at the limit. Either way the server
never buffers more than `max_bytes` of a request.
"""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tinystack.serve.api.errors import INVALID_REQUEST, error_response


class BodyTooLarge(HTTPException):
    """Raised from `receive` while the app reads the body. An HTTPException, so FastAPI's body
    parsing re-raises it (instead of turning it into a 400) and the error handler answers 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body is more than {max_bytes} bytes; the limit is {max_bytes}")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _reject(self, scope: Scope, size: str):
        return error_response(Request(scope), 413, f"request body is {size} bytes; the limit is {self.max_bytes}",
                              INVALID_REQUEST, "body_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._reject(scope, value.decode())(scope, receive, send)
                return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:  # read outside FastAPI's body parsing: answer here
            if not started:
                await self._reject(scope, f"more than {self.max_bytes}")(scope, receive, send)
