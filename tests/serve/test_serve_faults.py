"""Fault injection under the real server: engine steps that raise, a stalled engine, a dead engine loop.

Expected: degraded answers (or clean 503s), an open circuit after N consecutive
failures, a half-open probe that closes it again once the faults stop, a watchdog
that restarts a dead loop, and no crash or 500 anywhere.
"""
import time

import httpx
from serve_helpers import PROMPT, wait_for


def test_faulty_steps_give_degraded_answers_open_the_circuit_and_recover(serve, faulty_engine):
    model = faulty_engine.fault
    model.fail_rate = 0.3  # per forward pass; a 6-token request has 6 chances to fail
    served = serve(faulty_engine, fallback_text="(busy)", breaker_failures=3, breaker_cooldown_s=0.5)
    statuses, degraded, breaker_states = [], 0, set()
    with httpx.Client(base_url=served.url, timeout=10) as c:
        for i in range(40):
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "seed": i})
            statuses.append(r.status_code)
            body = r.json()
            if body.get("degraded"):
                degraded += 1
                assert body["choices"][0]["text"] == "(busy)" and body["choices"][0]["finish_reason"] == "stop"
            breaker_states.add(c.get("/health").json()["breaker"])
        assert set(statuses) == {200}  # the fallback answers; nothing crashes
        assert degraded >= 3 and served.state.breaker.times_opened >= 1 and "open" in breaker_states
        assert served.state.counters["engine_failures"] >= 3
        # faults stop: after the cool-down one probe goes through and closes the circuit
        model.fail_rate = 0.0
        time.sleep(0.6)
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 200 and "degraded" not in r.json()
        assert c.get("/health").json()["breaker"] == "closed"
        assert c.get("/health").json()["kv_bytes_in_use"] == 0


def test_without_fallback_failures_are_503_and_an_open_circuit_answers_at_once(serve, faulty_engine):
    faulty_engine.fault.failing = True
    served = serve(faulty_engine, breaker_failures=2, breaker_cooldown_s=30)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        for _ in range(2):
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        steps = faulty_engine.fault.steps
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
        assert r.status_code == 503 and "circuit breaker" in r.json()["error"]["message"]
        assert 25 <= int(r.headers["retry-after"]) <= 30
        assert faulty_engine.fault.steps == steps  # the open circuit kept it off the engine
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "stream": True})
        assert r.status_code == 503  # before the first token a stream still gets a real status


def test_a_stalled_engine_is_a_failure_not_a_hang(serve, faulty_engine):
    served = serve(faulty_engine, stall_timeout_s=0.3, timeout_s=10, fallback_text="(stalled)")
    faulty_engine.fault.delay_s = 1.0
    with httpx.Client(base_url=served.url, timeout=10) as c:
        t0 = time.perf_counter()
        r = c.post("/generate", json={"prompt": PROMPT, "max_tokens": 5})
        assert time.perf_counter() - t0 < 1.5
        assert r.status_code == 200 and r.json()["degraded"] is True and r.json()["text"] == "(stalled)"
        assert c.get("/health").json()["status"] in ("ok", "stalled")
    faulty_engine.fault.delay_s = 0.0
    assert wait_for(lambda: served.state.adapter.stats().kv_bytes_in_use == 0, 3)


def test_watchdog_restarts_a_dead_engine_loop(serve, faulty_engine):
    served = serve(faulty_engine, watchdog_interval_s=1.0)
    faulty_engine.fault.delay_s = 0.02
    with httpx.Client(base_url=served.url, timeout=10) as c:
        served.state.adapter.kill("simulated crash")
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "dead" and c.get("/ready").status_code == 503
        assert wait_for(lambda: c.get("/health").status_code == 200, 3)
        assert c.get("/health").json()["engine_restarts"] == 1
        # ignore_eos: a sampled first token may be EOS (a 200 with no tokens), which says nothing here
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
