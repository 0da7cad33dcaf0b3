"""`create_app`: an AsyncEngine and a ServeConfig in, the FastAPI app out.

    RequestContextMiddleware   request id, timing, timing headers; hands each finished request to
                               the app's Observer: metrics, log line, spans, cost (api/middleware.py)
    BodyLimitMiddleware        413 for bodies over max_body_bytes, before they are read (guards/body_limit.py)
    error handlers             one OpenAI-shaped error body for every failure (api/errors.py)
    authenticate               the API key check, a dependency of the app's root router: every route needs a
                               key unless it is on the open list (api/deps.py)
    routes                     /generate, /v1/*, /health, /ready, /metrics (api/routes.py); the pages (ui/pages.py)
    lifespan                   builds the ServerState (engine adapter, gate, breaker, rate
                               limiter, API keys, chat template) and the watchdog when the
                               server starts, and starts the Observer (engine gauges, batch
                               sizes, GC pauses + gc.freeze, event-loop lag); stops them when
                               it stops (state.py, engine/watchdog.py, tinystack.observe.observer)

Everything bound to an event loop is created inside the server's loop, so the same
app object can be served more than once (e.g. twice by `run_in_background`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI

from tinystack.atomic import read_json
from tinystack.config import RunConfig, ServeConfig
from tinystack.infer.chat import ChatFormatter, ChatTemplateError, chat_formatter, load_chat_template
from tinystack.model.generation_config import sampling_defaults
from tinystack.observe.logs import RequestLog
from tinystack.observe.metrics import EngineReading, ServeMetrics
from tinystack.observe.observer import Observer
from tinystack.observe.tracing import make_tracer
from tinystack.serve import lora_modules
from tinystack.serve.api.deps import authenticate
from tinystack.serve.api.errors import install_error_handlers
from tinystack.serve.api.middleware import RequestContextMiddleware
from tinystack.serve.api.openapi import served_openapi
from tinystack.serve.api.routes import router
from tinystack.serve.engine.async_adapter import make_adapter
from tinystack.serve.engine.watchdog import watchdog
from tinystack.serve.guards.auth import KeyChecker, load_key_hashes
from tinystack.serve.guards.body_limit import BodyLimitMiddleware
from tinystack.serve.guards.protect import AdmissionGate, CircuitBreaker
from tinystack.serve.guards.ratelimit import RateLimiter
from tinystack.serve.guards.redis_ratelimit import RedisRateLimiter
from tinystack.serve.state import ServerState
from tinystack.serve.ui.pages import ui_router

logger = logging.getLogger("tinystack.serve")


def checked_inputs(cfg: ServeConfig, model_dir: str | Path | None) -> tuple[KeyChecker, dict[str, Any]]:
    """What the server reads from files besides the weights: the API keys, the chat template (parsed here, to
    check it) and the model's sampling defaults (model/generation_config.py). Raises ValueError naming the file
    and what is wrong, before anything starts (in the app's start-up it would surface as a traceback)."""
    keys = KeyChecker(load_key_hashes(cfg.api_key_env, cfg.api_key_file))
    try:
        ChatFormatter(load_chat_template(model_dir))
    except ChatTemplateError as e:
        raise ValueError(f"{model_dir}: {e}") from None
    return keys, sampling_defaults(model_dir) if cfg.model_sampling_defaults else {}


def build_state(engine: Any, cfg: ServeConfig, model_dir: str | Path | None = None,
                inputs: tuple[KeyChecker, dict[str, Any]] | None = None) -> ServerState:
    """The shared objects of one server run (see state.py); `inputs`: checked_inputs' (read here if None)."""
    keys, defaults = inputs if inputs is not None else checked_inputs(cfg, model_dir)
    adapter = make_adapter(engine)
    name = cfg.model_name or (Path(model_dir).name if model_dir else "tinystack")
    queued = cfg.max_queued_requests * getattr(adapter, "replicas", 1)  # each replica keeps its own queue
    return ServerState(cfg=cfg, adapter=adapter, gate=AdmissionGate(adapter.max_num_seqs, queued),
                       breaker=CircuitBreaker(cfg.breaker_failures, cfg.breaker_cooldown_s),
                       limiter=make_limiter(cfg),
                       keys=keys, admin=KeyChecker(load_key_hashes(cfg.admin_key_env, "")),
                       chat=chat_formatter(model_dir, adapter.tokenizer), model_name=name,
                       lineage=served_lineage(model_dir), sampling_defaults=defaults)


def served_lineage(model_dir: str | Path | None) -> dict[str, Any]:
    """What /v1/models says of the served model: its tinystack.json, and its registry entry when it is served
    from the model registry (`--model registry:NAME`)."""
    if model_dir is None:
        return {}
    model_dir = Path(model_dir)
    lineage = read_json(model_dir / "tinystack.json") if (model_dir / "tinystack.json").is_file() else {}
    record = model_dir.parent / "record.json"  # <registry>/<name>/<version>/model
    if record.is_file():
        r = read_json(record)
        lineage = {**lineage, "registry": {k: r.get(k) for k in ("name", "version", "model_sha256", "added_at")}}
    return lineage


def make_limiter(cfg: ServeConfig) -> RateLimiter | RedisRateLimiter:
    """Per-key limits in this process, or in Redis (`redis_url`) when several gateway processes share them."""
    if cfg.redis_url:
        return RedisRateLimiter(cfg.redis_url, cfg.rate_limit_rpm, cfg.rate_limit_tpm)
    return RateLimiter(cfg.rate_limit_rpm, cfg.rate_limit_tpm)


def _engine_reading(app: FastAPI) -> EngineReading | dict[str, EngineReading] | None:
    state = app.state.server
    if state is None:
        return None
    if hasattr(state.adapter, "replica_stats"):  # replicas: one reading each, labelled by replica in /metrics
        return {rid: EngineReading(r.get("running", 0), r.get("waiting", 0), r.get("kv_usage", 0.0),
                                   r.get("preemptions", 0), r.get("prefix_cache_hits", 0),
                                   r.get("prefix_cache_queries", 0), r.get("spec_proposed_tokens", 0),
                                   r.get("spec_accepted_tokens", 0))
                for rid, r in state.adapter.replica_stats().items()}
    s = state.adapter.stats()
    return EngineReading(s.running, s.waiting, s.kv_usage, s.preemptions, s.prefix_cache_hits, s.prefix_cache_queries,
                         s.spec_proposed_tokens, s.spec_accepted_tokens)


def create_app(engine: Any, cfg: ServeConfig, request_log: RequestLog | None = None, *,
               model_dir: str | Path | None = None, span_exporter: Any = None,
               registry: str | Path = RunConfig.registry) -> FastAPI:
    """The serving app for `engine` (a `tinystack.infer.AsyncEngine`).

    Raises ValueError for a bad API key file or generation_config.json (checked_inputs).
    `request_log` receives one "request" line per HTTP request; the caller owns it
    (creates and closes it). `model_dir` is where the chat template
    (tokenizer_config.json) and the default model name come from. `span_exporter` (an
    OpenTelemetry SpanExporter) receives the request spans, as `cfg.otel_exporter` would. Run the
    app with `serve_forever` or `run_in_background`. `app.state.server` is the running ServerState,
    `app.state.observer` the Observer (its `metrics.registry` is this app's own). `registry` (run.registry):
    where `lora_modules` entries NAME=registry:REG are found and followed (lora_modules.py).
    """

    inputs = checked_inputs(cfg, model_dir)  # a bad key file or generation_config.json: a ValueError here
    loras = lora_modules.load_list(cfg, registry)  # (name, spec, path, followed, version); a bad one: ValueError

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(engine, cfg, model_dir, inputs)
        watched: dict[str, list[str]] = {}  # served name -> [registry name, version loaded]
        for name, spec, path, followed, version in loras:  # one that does not fit stops the start, naming it
            try:
                await state.adapter.add_lora(name, str(path))  # on the engine's thread
            except ValueError as e:
                raise ValueError(f"serve.lora_modules {name}={spec}: {e}") from None
            if followed:
                watched[name] = [followed, version]
        app.state.server = state
        logger.info("serving %s with %s", state.model_name, state.settings())
        dog = asyncio.create_task(watchdog(state.adapter, cfg.watchdog_interval_s))
        tasks = [dog] + ([asyncio.create_task(lora_modules.follow(state.adapter, watched, registry))]
                         if watched else [])
        observer.start(lambda: _engine_reading(app), state.adapter.add_step_listener, state.model_name)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
            await observer.stop()
            app.state.server = None
            state.adapter.close()

    app = FastAPI(title="tinystack", summary="Text generation with a tiny GPT; OpenAI-compatible.",
                  lifespan=lifespan, dependencies=[Depends(authenticate)])  # on every route: opt out by name
    app.openapi = lambda: served_openapi(app)  # type: ignore[method-assign]  # with this server's limits
    app.state.engine = engine
    app.state.serve_config = cfg
    app.state.server = None
    observer = Observer(ServeMetrics(), request_log, make_tracer(cfg.otel_exporter, span_exporter),
                        price_per_device_hour=cfg.price_per_device_hour, gc_freeze=cfg.gc_freeze,
                        loop_lag_interval_s=cfg.loop_lag_interval_s)
    app.state.observer = observer
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_body_bytes)  # inside: its 413s are logged
    app.add_middleware(RequestContextMiddleware, observer=observer)
    app.include_router(router)
    app.include_router(ui_router)  # GET / (playground), GET /dashboard (ui/pages.py)
    return app
