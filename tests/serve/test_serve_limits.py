"""Concurrency limit, timeouts with real cancellation, and /health staying responsive under load."""
import threading
import time

import httpx

PROMPT = "return the number of"


def post_in_threads(url: str, bodies: list[dict], timeout: float = 10.0) -> tuple[list, list[threading.Thread]]:
    """Send each body from its own thread, all at once; returns (responses filled in as they finish, threads)."""
    results: list = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def send(i: int, body: dict) -> None:
        with httpx.Client(base_url=url, timeout=timeout) as c:
            barrier.wait(timeout)
            results[i] = c.post("/generate", json=body)

    threads = [threading.Thread(target=send, args=(i, b), daemon=True) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    return results, threads


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_timeout_is_504_and_the_generation_really_stops(serve, slow_engine):
    slow_engine.delay_s = 0.05  # 200 tokens would take 10 s
    served = serve(slow_engine, timeout_s=0.3, max_concurrency=1)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        t0 = time.perf_counter()
        r = c.post("/generate", json={"prompt": PROMPT, "max_tokens": 200})
        elapsed = time.perf_counter() - t0
        assert r.status_code == 504, r.text
        err = r.json()["error"]
        assert err["type"] == "timeout_error" and "timed out" in err["message"] and "0.3" in err["message"]
        assert elapsed < 2.0
        # the worker saw the cancel event and stopped early, instead of generating all 200 tokens
        assert wait_for(lambda: len(slow_engine.finished) == 1, timeout=2.0)
        gen = slow_engine.finished[0]
        assert gen.finish_reason == "cancelled"
        assert len(gen.token_ids) < 20
        # and it gave its slot back: the next request (max_concurrency=1) runs
        r = c.post("/generate", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["finish_reason"] == "length"
        assert c.get("/health").json()["in_flight"] == 0


def test_waiting_for_a_slot_counts_toward_the_timeout(serve, slow_engine):
    slow_engine.delay_s = 0.05
    served = serve(slow_engine, timeout_s=1.0, max_concurrency=1)
    # each needs ~0.6 s: the first fits in 1 s; the second waits ~0.6 s, so it cannot finish in time
    results, threads = post_in_threads(served.url, [{"prompt": PROMPT, "max_tokens": 12}] * 2)
    for t in threads:
        t.join(10)
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200, 504]
    assert slow_engine.max_active == 1


def test_health_answers_quickly_while_all_slots_are_busy(serve, slow_engine):
    slow_engine.delay_s = 0.05  # 30 tokens = 1.5 s per generation
    served = serve(slow_engine, max_concurrency=2, timeout_s=10)
    results, threads = post_in_threads(served.url, [{"prompt": PROMPT, "max_tokens": 30}] * 2)
    assert wait_for(lambda: slow_engine.active == 2)
    with httpx.Client(base_url=served.url, timeout=5) as c:
        for _ in range(3):
            t0 = time.perf_counter()
            r = c.get("/health")
            assert time.perf_counter() - t0 < 0.5
            assert r.status_code == 200
            health = r.json()
            assert health["status"] == "ok" and health["max_concurrency"] == 2
        assert health["in_flight"] == 2
    for t in threads:
        t.join(10)
    assert [r.status_code for r in results] == [200, 200]


def test_concurrency_limit_holds_and_later_requests_report_queue_time(serve, slow_engine):
    slow_engine.delay_s = 0.02  # 10 tokens = 0.2 s per generation
    served = serve(slow_engine, max_concurrency=1, timeout_s=10)
    results, threads = post_in_threads(served.url, [{"prompt": PROMPT, "max_tokens": 10}] * 3)
    assert wait_for(lambda: slow_engine.active == 1)
    with httpx.Client(base_url=served.url, timeout=5) as c:
        assert wait_for(lambda: c.get("/health").json()["waiting"] == 2, timeout=2)
    for t in threads:
        t.join(10)
    assert all(r is not None and r.status_code == 200 for r in results)
    assert slow_engine.max_active == 1
    queue = sorted(r.json()["timing"]["queue_ms"] for r in results)
    assert queue[1] > 100 and queue[2] > 300  # waited for one and for two generations of ~200 ms
    for r in results:
        t = r.json()["timing"]
        assert t["total_ms"] >= t["queue_ms"] + t["inference_ms"]
        assert t["inference_ms"] >= 150
