"""The request log line: valid JSON with timings, tokens, cost and the key id (never the key or the prompt),
and a sink that takes 0.5 s per line does not slow requests down."""
import json
import logging
import statistics
import threading
import time

import httpx
import pytest
from serve_helpers import PROMPT

from tinystack.config import ServeConfig
from tinystack.observe import RequestLog
from tinystack.observe.logs import JsonLineFormatter
from tinystack.serve import create_app, run_in_background
from tinystack.serve.guards.auth import hash_key

SECRET_KEY = "sk-very-secret-key-0042"


def test_log_line_has_timing_tokens_cost_and_key_id_but_no_key_or_prompt(serve, async_engine, monkeypatch):
    monkeypatch.setenv("OBS_TEST_KEYS", SECRET_KEY)
    s = serve(async_engine, log=True, api_key_env="OBS_TEST_KEYS")
    auth = {"Authorization": f"Bearer {SECRET_KEY}", "x-request-id": "obs-1"}
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}, headers=auth)
        assert r.status_code == 200 and r.headers["x-request-id"] == "obs-1"
        assert c.post("/v1/completions", json={"prompt": PROMPT}).status_code == 401
    s.log.close()
    text = s.log_path.read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines()]  # every line is strict JSON
    assert SECRET_KEY not in text and PROMPT not in text and r.json()["choices"][0]["text"] not in text
    line = next(row for row in rows if row["request_id"] == "obs-1")
    assert line["key_id"] == hash_key(SECRET_KEY)[:12]
    assert line["status"] == 200 and line["failure"] is None and line["completion_tokens"] == 4
    for name in ("queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "tpot_ms", "total_ms"):
        assert line[name] >= 0
    # the same value, in seconds vs ms
    assert float(r.headers["x-queue-time"]) * 1e3 == pytest.approx(line["queue_ms"], abs=0.01)
    assert line["device_s"] > 0 and line["cost_usd"] > 0 and line["cost_per_1k_tokens"] > 0
    assert any(row["status"] == 401 and row["key_id"] == "anonymous" for row in rows)


class SlowSink(logging.Handler):
    """A sink (think: a disk that stalls) that takes `delay_s` per line."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s, self.lines = delay_s, []
        self.setFormatter(JsonLineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        time.sleep(self.delay_s)
        self.lines.append(self.format(record))


def latencies(engine, request_log, n: int = 8) -> list[float]:
    out = []
    with run_in_background(create_app(engine, ServeConfig(), request_log), shutdown_timeout_s=5) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})  # warm-up
            for i in range(n):
                t0 = time.perf_counter()
                assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "seed": i}).status_code == 200
                out.append(time.perf_counter() - t0)
    return out


def test_a_slow_log_sink_does_not_raise_request_latency(async_engine):
    sink = SlowSink(0.5)
    slow_log = RequestLog([sink])
    fast = latencies(async_engine, None)
    t0 = time.perf_counter()
    slow = latencies(async_engine, slow_log)
    elapsed = time.perf_counter() - t0
    assert len(sink.lines) < 9  # the sink is far behind: 9 lines take 4.5 s to write
    assert statistics.median(slow) < statistics.median(fast) + 0.25  # no 0.5 s per line in the requests
    assert max(slow) < 0.5 + max(fast)
    closer = threading.Thread(target=slow_log.close)
    closer.start()
    closer.join(10)
    assert len(sink.lines) == 9 and all(json.loads(line)["status"] == 200 for line in sink.lines)
    assert elapsed < 4.5  # the requests were done long before the lines were
