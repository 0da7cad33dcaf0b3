"""Timed-out and aborted requests are counted (failures, tokens, cost); per-request cost adds up to the engine's steps.

The engine is the conftest's FaultyModel (each step sleeps `delay_s`), so a request
can be made to time out, or be abandoned by its client mid-stream, at a known point.
"""
import json
import socket

import httpx
import pytest
from obs_helpers import scrape, total, value
from serve_helpers import PROMPT, wait_for


def timed_out_and_aborted(s) -> None:
    """One request that times out (504), one stream the client abandons after 3 chunks, one that succeeds."""
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "timeout": 0.4})
        assert r.status_code == 504
        host, port = s.url.removeprefix("http://").split(":")
        body = json.dumps({"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:  # a client that leaves mid-stream
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            received = b""
            while received.count(b"data: {") < 3:
                part = sock.recv(65536)
                assert part, f"the server closed the stream early: {received!r}"
                received += part
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200


def test_timed_out_and_aborted_requests_are_counted(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.03
    s = serve(faulty_engine, timeout_s=30)
    timed_out_and_aborted(s)

    def settled():
        m = scrape(s.url)
        return (value(m, "tinystack_request_failures_total", reason="timeout") == 1
                and value(m, "tinystack_request_failures_total", reason="aborted") == 1
                and value(m, "tinystack_request_success_total", finished_reason="abort") == 2
                and value(m, "tinystack_request_success_total", finished_reason="length") == 1)
    assert wait_for(settled, timeout=20), scrape(s.url)
    m = scrape(s.url)
    # the abandoned stream got at least 3 tokens, the timed-out one some: all counted, and paid for
    assert total(m, "tinystack_generation_tokens_total") >= 3 + 3 + 1
    assert total(m, "tinystack_request_device_seconds_total", key_id="anonymous") > 0.03 * 7
    assert value(m, "tinystack_e2e_request_latency_seconds_count") == 1  # latency: successful requests only
    assert value(m, "tinystack_http_requests_total", route="/v1/completions", status=504) == 1


@pytest.mark.parametrize("faulty_engine", ["continuous"], indirect=True)
def test_cost_per_request_adds_up_to_the_engine_steps(serve, faulty_engine, tmp_path):
    """Sum over requests (metrics and log lines) == the engine's own step totals, aborted/timed-out ones included."""
    faulty_engine.fault.delay_s = 0.02
    s = serve(faulty_engine, log=True, timeout_s=30, price_per_device_hour=3.6)  # 0.001 USD per device second
    timed_out_and_aborted(s)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        for n in (1, 3):
            assert c.post("/v1/completions", json={"prompt": PROMPT * n, "max_tokens": 5, "n": n}).status_code == 200
    counters = faulty_engine.engine.counters
    assert wait_for(lambda: not faulty_engine.engine.has_unfinished(), timeout=10)

    def metric_sums():
        m = scrape(s.url)
        return (total(m, "tinystack_request_device_seconds_total"), total(m, "tinystack_request_cpu_seconds_total"),
                total(m, "tinystack_request_cost_usd_total"))
    assert wait_for(lambda: metric_sums()[0] == pytest.approx(counters.wall_s, rel=1e-9, abs=1e-12), timeout=20), \
        (metric_sums(), counters)
    device, cpu, cost = metric_sums()
    assert counters.wall_s > 0.02 * counters.steps  # the steps really took that long
    assert cpu == pytest.approx(counters.cpu_s, rel=1e-9, abs=1e-12)
    assert cost == pytest.approx(counters.wall_s * 3.6 / 3600, rel=1e-9)
    s.log.close()  # flush: the same sums from the log lines (what `tinystack cost` reads)
    rows = [json.loads(line) for line in s.log_path.read_text().splitlines()]
    gen = [r for r in rows if r["path"] == "/v1/completions"]
    assert len(gen) == 5 and {r["failure"] for r in gen} == {"timeout", "aborted", None}
    assert sum(r["device_s"] for r in gen) == pytest.approx(counters.wall_s, abs=1e-5)
    assert sum(r["cpu_s"] for r in gen) == pytest.approx(counters.cpu_s, abs=1e-5)
