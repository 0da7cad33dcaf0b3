"""The browser pages: a playground at `GET /` and a live dashboard at `GET /dashboard`.

    GET /             static/playground.html  chat: the conversation + sampling parameters ->
                                              POST /v1/chat/completions (the model's chat template);
                                              or complete: a prompt -> POST /v1/completions; streamed
                                              (include_usage) -> tokens as they arrive, then a bar of
                                              the request's queue / prefill / decode time
    GET /dashboard    static/dashboard.html   polls GET /metrics (Prometheus text) every second:
                                              running / waiting, KV usage, batch size, latency
                                              percentiles, tokens/s, errors, history sparklines
    GET /ui/{name}    the pages' scripts and style sheet (static/*.js, static/*.css)

Plain HTML + JavaScript files shipped inside the package (package data: no build step,
no CDN, so it works on a machine without internet). The pages are open (no API key):
they hold no data; the calls they make (/v1/chat/completions, /v1/completions, /metrics) are checked as
usual, with the key typed into the page. Not in the OpenAPI schema.
"""
from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from tinystack.serve.api.errors import ApiError

STATIC_DIR = Path(__file__).parent / "static"
_ASSET = re.compile(r"[a-z][a-z0-9_-]*\.(js|css)")  # a plain file name: no path, no traversal
# Revalidate on every load: after an upgrade the browser must not mix old scripts with new pages.
_HEADERS = {"Cache-Control": "no-cache"}

ui_router = APIRouter(include_in_schema=False)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html; charset=utf-8", headers=_HEADERS)


@ui_router.get("/")
async def playground() -> FileResponse:
    """The playground: chat with the model (or continue a prompt), watch the answer stream, see where the time
    went."""
    return _page("playground.html")


@ui_router.get("/dashboard")
async def dashboard() -> FileResponse:
    """The live dashboard over /metrics."""
    return _page("dashboard.html")


@ui_router.get("/ui/{name}")
async def asset(name: str) -> FileResponse:
    """A script or style sheet of the pages; 404 for anything else."""
    path = STATIC_DIR / name
    if not _ASSET.fullmatch(name) or not path.is_file():
        raise ApiError(404, f"no such file: {name}", "not_found", "invalid_request_error")
    media = "text/javascript; charset=utf-8" if name.endswith(".js") else "text/css; charset=utf-8"
    return FileResponse(path, media_type=media, headers=_HEADERS)
