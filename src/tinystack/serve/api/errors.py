"""Every failure becomes one JSON shape, OpenAI's: `{"error": {"message", "type", "param", "code"}}`.

    ApiError raised anywhere in a request          -> its status, message, type, code
    RequestValidationError (pydantic / FastAPI)    -> 400 "field: reason; ..." (/generate: 422); malformed
                                                      JSON and text with an unpaired surrogate: 400 on every route
    Starlette HTTPException (404, 405, ...)        -> its status, reshaped
    anything else                                  -> 500 "internal server error (request id ...)"
                                                      (middleware.py; the traceback goes to the
                                                      `tinystack.serve` logger, never to the client)

Status codes: 400 bad request (malformed JSON, a value out of range, prompt too long
for the model), 401 missing or wrong API key, 413 body or prompt too large, 422 a
/generate field fails validation, 429 over capacity or over a rate limit (with
Retry-After), 503 engine unavailable or server draining, 504 timeout, 500 a bug.
"""
from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tinystack.serve.api.context import get_context
from tinystack.serve.api.schemas import UNPAIRED_SURROGATE, ErrorDetail, ErrorResponse

logger = logging.getLogger("tinystack.serve")

INVALID_REQUEST = "invalid_request_error"
TIMEOUT = "timeout_error"
SERVER_ERROR = "server_error"
AUTH_ERROR = "authentication_error"

# The 400s a request can get although it matches /openapi.json: what no JSON Schema can say (docs/serve.md). Each
# has its own code, so a client (and the fuzz test) tells them from a broken contract, whose code is invalid_value.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # the prompt's tokens (+ max_tokens) do not fit the context
INVALID_CONSTRAINT = "invalid_constraint"  # a JSON Schema / regex / grammar / tool schema llguidance cannot compile
CHAT_TEMPLATE_ERROR = "chat_template_error"  # the model's chat template refuses the conversation
CONFLICTING_FIELDS = "conflicting_fields"  # a rule between fields the schema cannot state (by value, or by name)
TOO_MANY_SEQUENCES = "too_many_sequences"  # a batch of prompts x n beyond what the server holds at once
UNDECLARED_REFUSALS = frozenset({CONTEXT_LENGTH_EXCEEDED, INVALID_CONSTRAINT, CHAT_TEMPLATE_ERROR,
                                 CONFLICTING_FIELDS, TOO_MANY_SEQUENCES})


class ApiError(Exception):
    """An error answer: HTTP `status`, a message for the client, an error `type` and a precise `code`;
    `failure` is the metrics' failure reason when the status alone would say it wrong (observe.observer)."""

    def __init__(self, status: int, message: str, code: str, type: str = INVALID_REQUEST, *,
                 param: str | None = None, headers: dict[str, str] | None = None, failure: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type
        self.param = param
        self.headers = headers or {}
        self.failure = failure

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: str, param: str | None = None) -> dict[str, Any]:
    return ErrorResponse(error=ErrorDetail(message=message, type=type, param=param, code=code)).model_dump()


def error_response(request: Request, status: int, message: str, type: str, code: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """Build the error body, mark the request's `returned` time and note the error for the request log."""
    ctx = get_context(request)
    if ctx is not None:
        ctx.mark_returned()
        ctx.fields.setdefault("error_code", code)
    return JSONResponse(error_body(message, type, code, param), status_code=status, headers=headers)


# pydantic names the branch of a union in an error's location ("stop.constrained-str",
# "prompt.list[str]"); the client only needs the field
_UNION_BRANCH = re.compile(r"(constrained-)?(str|int|float|bool|none)|(list|dict)\[.*\]")


def _field_name(loc: tuple[Any, ...], kind: str | None = None) -> str:
    parts = [str(p) for p in loc if p != "body"]
    keep_last = kind == "extra_forbidden"  # there the last part is the client's own key, whatever it is
    parts = [p for i, p in enumerate(parts)
             if not _UNION_BRANCH.fullmatch(p) or (keep_last and i == len(parts) - 1)]
    return ".".join(parts) if parts else "request body"


def validation_message(errors: list[dict[str, Any]]) -> str:
    """Pydantic errors -> "max_tokens: Input should be a valid integer; foo: Extra inputs are not permitted";
    the branches of a union field are one entry: "stop: String should have at least 1 character, or ..."."""
    out: dict[str, list[str]] = {}
    for err in errors:
        kind = err.get("type")
        field = _field_name(tuple(err.get("loc", ())), kind)
        if field == "request body" and kind == "missing":
            out.setdefault('request body is required: a JSON object with at least "prompt"', [])
        elif field == "request body" and kind in ("model_attributes_type", "dict_type", "model_type"):
            out.setdefault("request body must be a JSON object (send Content-Type: application/json)", [])
        else:
            out.setdefault(f"{field}: ", []).append(err.get("msg", "invalid value"))
    return "; ".join(head + ", or ".join(msgs) for head, msgs in out.items()) or "invalid request"


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    ctx = get_context(request)
    if ctx is not None and exc.failure is not None:
        ctx.failure = exc.failure
    return error_response(request, exc.status, exc.message, exc.type, exc.code, exc.param, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    bad_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if bad_json is not None:
        reason = (bad_json.get("ctx") or {}).get("error", "invalid JSON")
        pos = [p for p in bad_json.get("loc", ()) if isinstance(p, int)]
        where = f" at character {pos[0]}" if pos else ""
        return error_response(request, 400, f"malformed JSON body: {reason}{where}", INVALID_REQUEST, "malformed_json")
    bad_text = next((e for e in errors if e.get("type") == UNPAIRED_SURROGATE), None)
    if bad_text is not None:  # not a field out of range but text that is no Unicode: 400 like malformed JSON
        where = (bad_text.get("ctx") or {}).get("param")
        return error_response(request, 400, bad_text["msg"], INVALID_REQUEST, "invalid_unicode",
                              None if where == "request body" else where)
    # OpenAI answers 400 for a bad field; /generate keeps the foundation's 422
    status = 422 if request.url.path == "/generate" else 400
    # the deepest error names the field best (of a union's branches, the one that got furthest)
    deepest = max(errors, key=lambda e: len(e.get("loc", ())), default=None)
    param = _field_name(tuple(deepest.get("loc", ())), deepest.get("type")) if deepest else None
    return error_response(request, status, validation_message(errors), INVALID_REQUEST, "validation_error",
                          None if param == "request body" else param)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
    response = error_response(request, exc.status_code, str(exc.detail), INVALID_REQUEST if exc.status_code < 500
                              else SERVER_ERROR, codes.get(exc.status_code, f"http_{exc.status_code}"))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def unexpected_error_response(request: Request, exc: BaseException) -> JSONResponse:
    """500 for an exception nobody handled: generic message for the client, traceback to the server log."""
    ctx = get_context(request)
    rid = ctx.request_id if ctx is not None else "-"
    logger.error("unhandled error in request %s", rid, exc_info=exc)
    if ctx is not None:
        ctx.fields["error"] = type(exc).__name__
    return error_response(request, 500, f"internal server error (request id {rid})", SERVER_ERROR, "internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through `error_response`, so all non-2xx bodies share one shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # Exceptions nobody handles reach RequestContextMiddleware, which answers with
    # unexpected_error_response (it sits inside Starlette's ServerErrorMiddleware, so it
    # can still add the request id header and write the log line).
