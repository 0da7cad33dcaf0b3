"""API keys (env var and hashed key file) and per-key rate limits, against the real server."""

import httpx
import openai
import pytest

from tinystack.serve.guards.auth import KeyChecker, hash_key, load_key_hashes
from tinystack.serve.guards.ratelimit import RateLimiter

BODY = {"prompt": "return the", "max_tokens": 2}


def test_keys_from_env_and_hashed_file(serve, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_KEYS", "alpha-key, beta-key")
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"# allowed keys\n{hash_key('gamma-key')}\n\n")
    served = serve(engine, api_key_env="TEST_KEYS", api_key_file=str(key_file))
    with httpx.Client(base_url=served.url, timeout=10) as c:
        for key in ("alpha-key", "beta-key", "gamma-key"):
            assert c.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic alpha-key"},
                        {"Authorization": "Bearer " + hash_key("gamma-key")}):  # the hash itself is no key
            r = c.post("/v1/completions", json=BODY, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/models").status_code == 401
        assert c.post("/generate", json=BODY).status_code == 401
        assert c.post("/tokenize", json={"prompt": "x"}).status_code == 401
        assert c.post("/detokenize", json={"tokens": [1]}).status_code == 401
        alpha = {"Authorization": "Bearer alpha-key"}
        assert c.post("/tokenize", json={"prompt": "x"}, headers=alpha).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200  # open by default
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="beta-key", max_retries=0) as client:
        assert client.completions.create(model="m", prompt="x", max_tokens=2).usage.completion_tokens >= 1
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_health_can_require_a_key(serve, engine, monkeypatch):
    monkeypatch.setenv("TEST_KEYS", "k1")
    served = serve(engine, api_key_env="TEST_KEYS", open_health=False)
    assert httpx.get(f"{served.url}/health", timeout=5).status_code == 401
    assert httpx.get(f"{served.url}/health", headers={"Authorization": "Bearer k1"}, timeout=5).status_code == 200


def test_malformed_key_file_is_refused():
    with pytest.raises(ValueError, match="SHA-256"):
        load_key_hashes("", __file__)  # this file is not a list of hashes
    assert not KeyChecker([]).enabled


def test_request_rate_limit_is_429_with_a_correct_retry_after(serve, engine, monkeypatch):
    monkeypatch.setenv("TEST_KEYS", "a,b")
    served = serve(engine, api_key_env="TEST_KEYS", rate_limit_rpm=3)  # one request per 20 s after a burst of 3
    with httpx.Client(base_url=served.url, timeout=10) as c:
        a, b = {"Authorization": "Bearer a"}, {"Authorization": "Bearer b"}
        assert [c.post("/v1/completions", json=BODY, headers=a).status_code for _ in range(3)] == [200] * 3
        r = c.post("/v1/completions", json=BODY, headers=a)
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        retry = int(r.headers["retry-after"])
        assert 17 <= retry <= 20  # 1 request refills in 60/3 = 20 s, minus the time the 3 took
        assert c.post("/v1/completions", json=BODY, headers=b).status_code == 200  # per key


def test_token_rate_limit_counts_prompt_plus_max_tokens(serve, engine, tokenizer, monkeypatch):
    monkeypatch.setenv("TEST_KEYS", "a")
    served = serve(engine, api_key_env="TEST_KEYS", rate_limit_tpm=600)  # burst 600, then 10 tokens per second
    h = {"Authorization": "Bearer a"}
    prompt = " ".join(["return the number"] * 5)  # long prompt, 1 new token: cheap to run, costly to the limit
    cost = len(tokenizer.encode_ordinary(prompt)) + 1
    assert 20 <= cost <= 70
    with httpx.Client(base_url=served.url, timeout=10) as c:
        statuses = [c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}, headers=h).status_code
                    for _ in range(600 // cost + 2)]
        assert statuses[:600 // cost - 1] == [200] * (600 // cost - 1) and statuses[-1] == 429
        r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}, headers=h)
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= -(-cost // 10)
        assert "tokens per minute" in r.json()["error"]["message"]


def test_token_bucket_arithmetic():
    now = [0.0]
    limiter = RateLimiter(requests_per_min=60, tokens_per_min=0, clock=lambda: now[0])
    assert all(limiter.check("k", 5)[0] for _ in range(60))
    ok, retry, which = limiter.check("k", 5)
    assert not ok and retry == 1 and which == "requests"
    now[0] += 1.0
    assert limiter.check("k", 5)[0]
    big = RateLimiter(requests_per_min=0, tokens_per_min=100, clock=lambda: now[0])
    assert big.check("k", 101) == (False, None, "tokens")  # can never fit
