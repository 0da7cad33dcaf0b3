"""`create_app`: an Engine and a ServeConfig in, a FastAPI app with /generate and /health out.

    RequestContextMiddleware   request id, arrival time, one log line per request (middleware.py)
    error handlers             one error shape for every failure (errors.py)
    routes                     POST /generate, GET /health (routes.py -> service.py)
    lifespan                   builds the InferenceRunner (semaphore + thread pool) when the
                               server starts and stops it when the server stops (runner.py)

The runner is created inside the server's event loop, so the same app object can be
served more than once (e.g. twice by `run_in_background`) without sharing a loop-bound
semaphore or a shut-down thread pool between runs.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI

from tinystack.config import ServeConfig
from tinystack.observe.logs import RequestLog
from tinystack.serve.errors import install_error_handlers
from tinystack.serve.middleware import RequestContextMiddleware
from tinystack.serve.routes import router
from tinystack.serve.runner import InferenceRunner


def create_app(engine: Any, cfg: ServeConfig, request_log: RequestLog | None = None) -> FastAPI:
    """The serving app for `engine` (an `tinystack.infer.Engine`, or anything with its
    `generate(prompt, params, cancel=)`, `encode_prompt(prompt)` and `max_seq_len`).

    `request_log` receives one "request" line per HTTP request; the caller owns it
    (creates and closes it). Run the app with `serve_forever` or `run_in_background`.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner = InferenceRunner(engine.generate, cfg.max_concurrency, cfg.timeout_s)
        app.state.runner = runner
        try:
            yield
        finally:
            app.state.runner = None
            runner.close()

    app = FastAPI(title="tinystack", summary="Text generation with a tiny GPT.", lifespan=lifespan)
    app.state.engine = engine
    app.state.serve_config = cfg
    app.state.runner = None
    install_error_handlers(app)
    app.add_middleware(RequestContextMiddleware, request_log=request_log)
    app.include_router(router)
    return app
