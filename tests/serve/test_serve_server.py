"""run_in_background: picks a free port, reports startup failures clearly, streams without delay, stops cleanly."""
import asyncio
import sys
import time
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from tinystack.serve import run_in_background


def tiny_app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict:
        return {"pong": True}

    return app


def test_port_zero_is_resolved_and_the_server_stops_on_exit():
    with run_in_background(tiny_app(), port=0) as url:
        port = int(url.rsplit(":", 1)[1])
        assert url.startswith("http://127.0.0.1:") and port > 0
        assert httpx.get(f"{url}/ping", timeout=5).json() == {"pong": True}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/ping", timeout=2)


def test_the_same_app_can_be_served_twice(engine):
    from tinystack.config import ServeConfig
    from tinystack.serve import create_app

    app = create_app(engine, ServeConfig())
    for _ in range(2):
        with run_in_background(app) as url:
            r = httpx.post(f"{url}/generate", json={"prompt": "the", "max_tokens": 2}, timeout=10)
            assert r.status_code == 200


def test_a_port_in_use_fails_at_once():
    with run_in_background(tiny_app()) as url:
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            with run_in_background(tiny_app(), port=port):
                pass


def test_a_failing_startup_is_reported():
    @asynccontextmanager
    async def lifespan(app):
        raise RuntimeError("model missing")
        yield

    with pytest.raises(RuntimeError, match="startup"):
        with run_in_background(FastAPI(lifespan=lifespan), startup_timeout_s=5, log_level="critical"):
            pass


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_streamed_chunks_arrive_as_they_are_sent(monkeypatch, loop):
    """10 chunks 2 ms apart must not arrive in one piece. With the plain asyncio loop (uvicorn without
    uvloop, as `pip install tinystack` gets it) connections on a socket bound without proto=TCP kept
    Nagle's algorithm: after the first chunk everything waited for the client's delayed ACK (~40 ms)."""
    if loop == "asyncio":
        monkeypatch.setitem(sys.modules, "uvloop", None)  # uvicorn's "auto" loop falls back to asyncio
    else:
        pytest.importorskip("uvloop")
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks():
            for i in range(10):
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(0.002)
        return StreamingResponse(chunks(), media_type="text/event-stream")

    with run_in_background(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(4):  # one keep-alive connection: past its first segments, ACKs are delayed
            arrivals = []
            with client.stream("GET", "/stream") as r:
                for line in r.iter_lines():
                    if line:
                        arrivals.append(time.perf_counter())
            assert len(arrivals) == 10
            assert arrivals[-1] - arrivals[0] >= 0.009, [round((t - arrivals[0]) * 1e3, 2) for t in arrivals]
