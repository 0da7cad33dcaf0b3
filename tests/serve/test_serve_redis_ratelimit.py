"""Per-key rate limits kept in Redis (guards/redis_ratelimit.py), against a real redis-server.

The test starts Debian's redis-server on 127.0.0.1 at a free port (`make test` installs it) and runs
two gateway processes' worth of apps (two servers, one engine each) sharing it: a key's limit holds
across both, whichever serves the request.
"""
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import tiny_gpt, unbatched

from tinystack.serve.guards.redis_ratelimit import RedisRateLimiter

KEYS = "key-one,key-two"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = shutil.which("redis-server")
    assert server, "redis-server is missing: apt-get install redis-server (make test does)"
    port = _free_port()
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


def _post(url: str, key: str, i: int) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"prompt": f"return the number {i}", "max_tokens": 2},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_limit_of_5_per_minute_holds_across_two_gateways(serve, tokenizer, redis_url, monkeypatch):
    monkeypatch.setenv("TINYSTACK_API_KEYS", KEYS)
    servers = [serve(unbatched(tiny_gpt(tokenizer), tokenizer), rate_limit_rpm=5, redis_url=redis_url)
               for _ in range(2)]
    try:
        urls = [s.url for s in servers]
        statuses = [_post(urls[i % 2], "key-one", i).status_code for i in range(5)]
        assert statuses == [200] * 5  # 3 on one gateway, 2 on the other: 5 of key-one's budget
        for url in urls:  # the 6th, whichever gateway gets it
            r = _post(url, "key-one", 6)
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(r.headers["retry-after"]) <= 12  # one request refills in 60 / 5 s
        assert _post(urls[1], "key-two", 7).status_code == 200  # another key has its own budget
    finally:
        for s in servers:
            s.engine.shutdown()


def test_concurrent_requests_never_exceed_the_limit(redis_url):
    """The Lua script reads and takes atomically: 40 racing checks on 8 threads, two limiter objects
    (two gateways), exactly 5 allowed. Repeated with fresh keys."""
    limiters = [RedisRateLimiter(redis_url, 5, 0), RedisRateLimiter(redis_url, 5, 0)]
    for trial in range(10):
        key = f"race-{trial}-{time.time_ns()}"
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i, key=key: limiters[i % 2].check(key, 1), range(40)))
        assert sum(ok for ok, _, _ in results) == 5
        assert all(retry >= 1 and which == "requests" for ok, retry, which in results if not ok)


def test_token_limit_and_a_request_larger_than_it(redis_url):
    limiter = RedisRateLimiter(redis_url, 0, 100)
    key = f"tokens-{time.time_ns()}"
    assert limiter.check(key, 60) == (True, 0, "")
    ok, retry, which = limiter.check(key, 60)  # 40 left; 20 more refill in 12 s
    assert not ok and which == "tokens" and 11 <= retry <= 13
    assert limiter.check(key, 101) == (False, None, "tokens")  # never fits: no Retry-After


def test_redis_down_is_a_503_not_a_500(serve, engine):
    s = serve(engine, rate_limit_rpm=5, redis_url=f"redis://127.0.0.1:{_free_port()}/0")
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "rate_limit_store_unavailable"
    assert "retry-after" in r.headers
