"""Graceful shutdown: on SIGTERM /ready turns 503, in-flight requests finish within the grace period, then exit."""
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

from tinystack.config import ServeConfig
from tinystack.serve import create_app
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
