"""Graceful shutdown: on SIGTERM /ready turns 503, in-flight requests finish within the grace period, then exit;
new requests meanwhile get a 503 in the OpenAI shape; those still running when the grace runs out get one too
(streams: an error event, then [DONE]), and every request keeps its log line."""
import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import uvicorn
from serve_helpers import PROMPT, FaultyModel, tiny_gpt, wait_for

from tinystack.config import InferConfig, ServeConfig
from tinystack.infer import AsyncEngine, LLMEngine
from tinystack.observe import setup_request_log
from tinystack.observe.observer import Observer
from tinystack.serve import create_app
from tinystack.serve.api.middleware import RequestContextMiddleware
from tinystack.serve.server import DrainingServer

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_in_flight_requests(faulty_engine):
    """In-process: handle_exit is what uvicorn's SIGTERM handler calls."""
    faulty_engine.fault.delay_s = 0.03  # 30 tokens ~ 1 s
    app = create_app(faulty_engine, replace(ServeConfig(), shutdown_grace_s=5))
    port = _free_port()
    server = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=5), drain_delay_s=0.5)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    result = {}

    def long_request():
        result["r"] = httpx.post(f"{url}/v1/completions", timeout=10,
                                 json={"prompt": "return the", "max_tokens": 30, "ignore_eos": True})

    client = threading.Thread(target=long_request)
    client.start()
    while app.state.server.adapter.stats().running == 0:
        time.sleep(0.01)
    server.handle_exit(signal.SIGTERM, None)
    r = httpx.get(f"{url}/ready", timeout=5)  # still accepting during drain_delay_s, but not ready
    assert r.status_code == 503 and r.json()["status"] == "draining"
    client.join(10)
    thread.join(10)
    assert not thread.is_alive()
    assert result["r"].status_code == 200 and result["r"].json()["usage"]["completion_tokens"] == 30


ERROR_KEYS = {"message", "type", "param", "code"}


def test_when_the_grace_runs_out_every_request_gets_a_503_and_a_log_line(tokenizer, tmp_path):
    # one sequence at a time, ~50 ms a token: a stream runs, a whole request waits in the engine's queue
    engine = AsyncEngine(LLMEngine(FaultyModel(tiny_gpt(tokenizer), delay_s=0.05), tokenizer,
                                   InferConfig(max_num_seqs=1, num_kv_blocks=64)))
    log_path = tmp_path / "requests.jsonl"
    log = setup_request_log(log_path)
    app = create_app(engine, replace(ServeConfig(), timeout_s=30, stall_timeout_s=30), log)
    port = _free_port()
    server = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1), grace_s=1.0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: server.started, 10)
        out: dict = {}
        body = {"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True}

        def streamed():
            with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=20) as r:
                out["stream"] = (r.status_code, [line for line in r.iter_lines() if line])

        def whole():
            out["whole"] = httpx.post(f"{url}/v1/completions", json=body, timeout=20)

        clients = [threading.Thread(target=streamed), threading.Thread(target=whole)]
        clients[0].start()
        state = app.state.server
        assert wait_for(lambda: state.adapter.stats().running == 1, 10)
        clients[1].start()
        assert wait_for(lambda: state.adapter.stats().waiting == 1, 10)  # queued in the engine
        server.handle_exit(signal.SIGTERM, None)
        assert wait_for(lambda: state.refusing, 5)
        late = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 2}, timeout=10)  # port still open
        assert late.status_code == 503 and set(late.json()["error"]) == ERROR_KEYS
        assert late.json()["error"]["code"] == "server_shutting_down" and late.headers["retry-after"] == "1"
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 503
        for c in clients:
            c.join(20)
        thread.join(15)
        assert not thread.is_alive()
    finally:
        server.force_exit = server.should_exit = True
        thread.join(5)
        log.close()
        engine.shutdown()
    whole = out["whole"]
    assert whole.status_code == 503, whole.text  # not uvicorn's plain-text 500
    assert whole.json()["error"]["code"] == "server_shutting_down" and set(whole.json()["error"]) == ERROR_KEYS
    status, lines = out["stream"]
    assert status == 200 and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    assert len(lines) > 3  # tokens came before the cut
    assert state.adapter.stats().ended.get("abort") == 2  # both sequences were aborted in the engine
    rows = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    gen = {(r["status"], r["failure"]) for r in rows if r["path"] == "/v1/completions"}
    assert len([r for r in rows if r["path"] == "/v1/completions"]) == 3
    assert gen == {(200, "aborted"), (503, "aborted"), (503, "overloaded")}  # stream cut, whole cut, late refused
    assert all(r["status"] is not None for r in rows)


def test_a_request_still_stuck_when_the_server_exits_gets_a_503_not_a_plain_500(tmp_path):
    """The last resort under the cut: uvicorn cancels what is left; the middleware still answers and logs."""
    async def stuck(scope, receive, send):
        if scope["type"] == "lifespan":
            return
        await asyncio.sleep(3600)

    log_path = tmp_path / "requests.jsonl"
    log = setup_request_log(log_path)
    port = _free_port()
    server = DrainingServer(uvicorn.Config(RequestContextMiddleware(stuck, Observer(request_log=log)), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"), grace_s=0.2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: server.started, 10)
        result = {}
        client = threading.Thread(target=lambda: result.setdefault(
            "r", httpx.get(f"http://127.0.0.1:{port}/anything", timeout=20)))
        client.start()
        assert wait_for(lambda: server.server_state.tasks, 5)
        server.handle_exit(signal.SIGTERM, None)
        client.join(20)
        thread.join(15)
    finally:
        server.force_exit = server.should_exit = True
        thread.join(5)
        log.close()
    r = result["r"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text
    rows = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    assert [row["status"] for row in rows] == [503]


@pytest.mark.slow
def test_tinystack_serve_exits_cleanly_on_sigterm(model_dir):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tinystack", "serve", "--model", str(model_dir), "--port", str(port),
                             "--drain-delay-s", "1.0", "--shutdown-grace-s", "3", "--max-num-seqs", "2",
                             "--log-level", "warning"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.1)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "return the", "max_tokens": 3}, timeout=10)
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert httpx.get(f"{url}/ready", timeout=2).status_code == 503
        assert proc.wait(timeout=15) == 0
        err = proc.stderr.read()
        assert "max_num_seqs = 2" in err  # the settings in force are printed at start-up
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


HANGING_SERVER = """
import asyncio, contextlib, sys
import uvicorn
from fastapi import FastAPI
from tinystack.serve.server import DrainingServer

@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    await asyncio.sleep(3600)  # a shutdown step that never ends (as a stuck engine or cluster stop would)

app = FastAPI(lifespan=lifespan)
config = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
DrainingServer(config, 0.0, 1.0, exit_deadline_s=float(sys.argv[2])).run()
"""


def test_a_shutdown_that_hangs_ends_at_the_exit_deadline_with_every_stack_on_stderr():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", HANGING_SERVER, str(port), "2.0"], stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/docs"), 30)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-2000:]
    assert 2.0 <= took < 10.0, took
    assert "Timeout" in err and "most recent call first" in err and "uvicorn" in err, err[-3000:]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False
