"""Serving: an Engine behind an OpenAI-compatible HTTP API that stays up under overload, faults and bad input.

Data flow of POST /v1/completions (chat and /generate are the same past parsing):

    HTTP request
      -> RequestContextMiddleware  request id, timing "arrival", timing headers        (middleware.py)
      -> BodyLimitMiddleware       413 over max_body_bytes                              (body_limit.py)
      -> CompletionRequest         pydantic: types, ranges, no unknown fields -> 400   (openai_schemas.py)
      -> caller                    API key (Bearer, hashed, constant time) -> 401      (deps.py, auth.py)
      -> prepare_completion        prompt -> ids; context / limits with numbers -> 400 (requests.py, chat.py)
      -> check_rate                per-key token buckets -> 429 + Retry-After          (ratelimit.py)
      -> execution.run             breaker open -> fallback / 503; gate full -> 429    (execution.py, protect.py)
      -> generation.generate       n choices on the engine, stop strings, deadline     (generation.py, detok.py)
      -> EngineAdapter.stream      the only code that knows the engine's API  (engine_adapter.py,
                                   async_adapter.py: AsyncEngine, threaded_adapter.py: Engine)
      -> openai_service            whole JSON answer, or SSE chunks + data: [DONE]     (openai_service.py)
    timeout -> abort + 504; engine fails/stalls -> abort + degraded/503; client gone -> abort
    after sending -> Observer.finish (tinystack.observe): metrics, JSON log line, spans, cost,
                     once every sequence's cost (RequestTracker / adapter on_usage) is in  (tracking.py)

The lifespan builds the ServerState (state.py) and a watchdog that restarts a dead
engine loop (watchdog.py). `create_app` builds the app (app.py); `serve_forever`
(SIGTERM: /ready 503, finish in-flight within a grace period) and `run_in_background`
run it with uvicorn (server.py); `tinystack serve` is the CLI (commands.py).
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "build_state": "tinystack.serve.app",
    "create_app": "tinystack.serve.app",
    "EngineAdapter": "tinystack.serve.engine_adapter",
    "EngineStats": "tinystack.serve.engine_adapter",
    "TokenEvent": "tinystack.serve.engine_adapter",
    "make_adapter": "tinystack.serve.engine_adapter",
    "ApiError": "tinystack.serve.errors",
    "ErrorDetail": "tinystack.serve.schemas",
    "ErrorResponse": "tinystack.serve.schemas",
    "GenerateRequest": "tinystack.serve.schemas",
    "GenerateResponse": "tinystack.serve.schemas",
    "HealthResponse": "tinystack.serve.schemas",
    "Timing": "tinystack.serve.schemas",
    "run_in_background": "tinystack.serve.server",
    "serve_forever": "tinystack.serve.server",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["ApiError", "EngineStats", "ErrorDetail", "ErrorResponse", "GenerateRequest", "GenerateResponse",
           "HealthResponse", "EngineAdapter", "Timing", "TokenEvent", "build_state", "create_app",
           "make_adapter", "run_in_background", "serve_forever"]
