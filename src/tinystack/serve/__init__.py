"""Serving: an Engine behind an HTTP API (FastAPI + uvicorn), with limits, timeouts and timing.

Data flow of POST /generate:

    HTTP request
      -> RequestContextMiddleware   request id (x-request-id or uuid4 hex), timing "arrival"  (middleware.py)
      -> GenerateRequest            pydantic: types, ranges, no unknown fields       (schemas.py)
      -> validated_request          config limits, prompt chars and tokens           (deps.py)
      -> InferenceRunner.run        "enqueue" -> semaphore slot -> worker thread:     (runner.py)
                                    "start" -> engine.generate(cancel=event) -> "end"
                                    deadline cfg.timeout_s -> cancel -> 504
      -> GenerateResponse           text, tokens, counts, finish_reason, timing ms   (service.py)
      -> "returned"; x-request-id header; one JSON log line (tinystack.observe)
    errors at any step -> {"error": {"message", "type", "code"}}                     (errors.py)

GET /health answers from the event loop with the current load. `create_app` builds
the app (app.py); `serve_forever` / `run_in_background` run it with uvicorn (server.py).
"""
from tinystack.serve.app import create_app
from tinystack.serve.errors import ApiError
from tinystack.serve.runner import InferenceRunner, InferenceTimeout
from tinystack.serve.schemas import (ErrorDetail, ErrorResponse, GenerateRequest, GenerateResponse, HealthResponse,
                                     Timing)
from tinystack.serve.server import run_in_background, serve_forever

__all__ = ["ApiError", "ErrorDetail", "ErrorResponse", "GenerateRequest", "GenerateResponse", "HealthResponse",
           "InferenceRunner", "InferenceTimeout", "Timing", "create_app", "run_in_background", "serve_forever"]
