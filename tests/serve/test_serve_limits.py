"""Timeouts, client disconnects and the waiting queue: each frees the engine's KV memory at once."""
import socket
import threading
import time

import httpx
from serve_helpers import PROMPT, wait_for


def idle(served) -> bool:
    s = served.state.adapter.stats()
    return s.running == 0 and s.waiting == 0 and s.kv_bytes_in_use == 0 and served.state.gate.in_flight == 0


def test_timeout_is_504_and_the_engine_frees_the_sequence(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.05  # 40 tokens would take 2 s
    served = serve(faulty_engine, timeout_s=0.4, max_num_seqs=1)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True})
        elapsed = time.perf_counter() - t0
        assert r.status_code == 504, r.text
        err = r.json()["error"]
        assert err["type"] == "timeout_error" and "0.4" in err["message"]
        assert elapsed < 1.5
        steps = faulty_engine.fault.steps
        assert wait_for(lambda: idle(served), 1.0)  # aborted: blocks (here: the KV cache) freed at once
        time.sleep(0.2)
        assert faulty_engine.fault.steps <= steps + 1  # and it really stopped stepping
        # a request may lower the timeout, not raise it
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "timeout": 0.1})
        assert r.status_code == 504 and "0.1" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "timeout": 99})
        assert r.status_code == 200


def test_streaming_timeout_sends_an_error_event_and_frees(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.05
    served = serve(faulty_engine, timeout_s=0.5)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "stream": True,
                                                        "ignore_eos": True}) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert '"timeout_error"' in lines[-2]
    assert wait_for(lambda: idle(served), 1.0)


def _raw_post(url: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def test_client_disconnect_aborts_non_streaming_and_streaming(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.05
    served = serve(faulty_engine, timeout_s=10)
    for stream in (b"false", b"true"):
        sock = _raw_post(served.url, b'{"prompt": "return the", "max_tokens": 40, "ignore_eos": true, "stream": %s}'
                         % stream)
        assert wait_for(lambda: served.state.adapter.stats().kv_bytes_in_use > 0, 3)
        time.sleep(0.2)
        sock.close()  # the client goes away mid-generation
        assert wait_for(lambda: idle(served), 2.0), served.state.adapter.stats()
    assert served.state.counters["aborted"] >= 1


def test_full_queue_is_429_at_once_with_retry_after(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.05
    served = serve(faulty_engine, max_num_seqs=1, max_queued_requests=1, timeout_s=10)
    results = []

    def send():
        with httpx.Client(base_url=served.url, timeout=10) as c:
            results.append(c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 15, "ignore_eos": True}))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    assert wait_for(lambda: served.state.gate.in_flight == 2)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5})
        assert r.status_code == 429 and time.perf_counter() - t0 < 0.5
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_overloaded"
        health = c.get("/health").json()
        assert health["in_flight"] == 2 and health["running"] + health["waiting"] == 2
    for t in threads:
        t.join(10)
    assert [r.status_code for r in results] == [200, 200]
    assert wait_for(lambda: idle(served), 1.0)


def test_health_answers_quickly_while_every_sequence_is_busy(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.03
    served = serve(faulty_engine, max_num_seqs=2)
    threads = [threading.Thread(target=lambda: httpx.post(f"{served.url}/generate", timeout=10,
                                                          json={"prompt": PROMPT, "max_tokens": 30}))
               for _ in range(2)]
    for t in threads:
        t.start()
    busy = min(2, served.state.adapter.max_num_seqs)  # the unbatched engine runs one, the other waits in it
    assert wait_for(lambda: (s := served.state.adapter.stats()).running == busy and s.running + s.waiting == 2)
    with httpx.Client(base_url=served.url, timeout=5) as c:
        for _ in range(3):
            t0 = time.perf_counter()
            r = c.get("/health")
            assert time.perf_counter() - t0 < 1.0 and r.status_code == 200
            assert r.json()["status"] == "ok" and r.json()["running"] == busy
        assert c.get("/ready").json()["status"] == "ready"
    for t in threads:
        t.join(10)


def test_body_over_the_limit_is_413(serve, engine):
    served = serve(engine, max_body_bytes=1000)
    r = httpx.post(f"{served.url}/v1/completions", json={"prompt": "x" * 2000}, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert "1000" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"y" * 100
        yield b'"}'

    r = httpx.post(f"{served.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=10)
    assert r.status_code == 413
