"""Serving: the AsyncEngine behind an OpenAI-compatible HTTP API that stays up under overload, faults and bad input.

Data flow of POST /v1/completions (chat and /generate are the same past parsing):

    HTTP request
      -> RequestContextMiddleware  request id, timing "arrival", timing headers        (api/middleware.py)
      -> BodyLimitMiddleware       413 over max_body_bytes                              (guards/body_limit.py)
      -> authenticate              API key (Bearer, hashed, constant time) -> 401, on every route unless
                                   listed open                                          (api/deps.py, guards/auth.py)
      -> CompletionRequest         pydantic: types, ranges, no unknown fields -> 400   (api/openai_schemas.py)
      -> prepare_completion        prompt -> ids; context / limits with numbers -> 400 (api/requests.py, infer/chat.py)
      -> check_rate                per-key token buckets -> 429 + Retry-After          (guards/ratelimit.py)
      -> execution.run             breaker open -> fallback / 503; gate full -> 429
                                                                (engine/execution.py, guards/protect.py)
      -> generation.generate       n choices on the engine, stop strings, deadline
                                                                (engine/generation.py, engine/detok.py)
      -> EngineAdapter.stream      the only code that knows the engine's API  (engine/adapter.py,
                                   engine/async_adapter.py: tinystack.infer.AsyncEngine)
      -> openai_service            whole JSON answer, or SSE chunks + data: [DONE]     (api/openai_service.py)
    timeout -> abort + 504; engine fails/stalls -> abort + degraded/503; client gone -> abort
    after sending -> Observer.finish (tinystack.observe): metrics, JSON log line, spans, cost,
                     once every sequence's cost (RequestTracker / adapter on_usage) is in  (engine/tracking.py)

The lifespan builds the ServerState (state.py) and a watchdog that restarts a dead
engine loop (engine/watchdog.py). `create_app` builds the app (app.py); `serve_forever`
(SIGTERM: /ready 503, finish in-flight within a grace period) and `run_in_background`
run it with uvicorn (server.py); `tinystack serve` is the CLI (commands.py).

Folders by role: api/ (HTTP: schemas, routes, errors, middleware), engine/ (the adapter to
tinystack.infer and the per-request execution around it), guards/ (auth, rate limits, body
limit, admission gate and breaker), ui/ (the playground and dashboard pages).
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "build_state": "tinystack.serve.app",
    "create_app": "tinystack.serve.app",
    "EngineAdapter": "tinystack.serve.engine.adapter",
    "EngineStats": "tinystack.serve.engine.adapter",
    "TokenEvent": "tinystack.serve.engine.adapter",
    "make_adapter": "tinystack.serve.engine.async_adapter",
    "ApiError": "tinystack.serve.api.errors",
    "ErrorDetail": "tinystack.serve.api.schemas",
    "ErrorResponse": "tinystack.serve.api.schemas",
    "GenerateRequest": "tinystack.serve.api.schemas",
    "GenerateResponse": "tinystack.serve.api.schemas",
    "HealthResponse": "tinystack.serve.api.schemas",
    "Timing": "tinystack.serve.api.schemas",
    "run_in_background": "tinystack.serve.server",
    "serve_forever": "tinystack.serve.server",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["ApiError", "EngineStats", "ErrorDetail", "ErrorResponse", "GenerateRequest", "GenerateResponse",
           "HealthResponse", "EngineAdapter", "Timing", "TokenEvent", "build_state", "create_app",
           "make_adapter", "run_in_background", "serve_forever"]
