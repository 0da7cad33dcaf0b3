"""POST /generate against a real server: valid answers, determinism, and a 4xx (never 5xx) for bad input."""
import re

import httpx
import pytest
from serve_helpers import PROMPT

from tinystack.infer import PromptTooLongError


@pytest.fixture
def client(serve, engine):
    served = serve(engine, max_tokens_limit=32)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        yield c


def test_valid_request_returns_text_tokens_and_timing(client, tokenizer):
    r = client.post("/generate", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0.8, "seed": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["text"], str)
    assert body["prompt_tokens"] == len(tokenizer.encode_ordinary(PROMPT))
    assert body["completion_tokens"] == len(body["tokens"]) <= 8
    assert body["text"] == tokenizer.decode(body["tokens"])
    assert body["finish_reason"] in ("stop", "length")
    t = body["timing"]
    assert {"queue_ms", "inference_ms", "total_ms", "prefill_ms", "decode_ms", "ttft_ms", "tpot_ms"} <= set(t)
    assert all(v >= 0 for k, v in t.items() if k != "tpot_ms" or body["completion_tokens"] > 1)
    assert t["total_ms"] >= t["queue_ms"] + t["inference_ms"]
    assert t["inference_ms"] > 0
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


def test_incoming_request_id_is_honoured(client):
    r = client.post("/generate", json={"prompt": PROMPT, "max_tokens": 2}, headers={"x-request-id": "abc-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
    r = client.post("/generate", json={"prompt": PROMPT, "max_tokens": 2}, headers={"x-request-id": "bad id\t!"})
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # not plain: replaced


@pytest.mark.parametrize("params", [{"temperature": 0.0, "seed": 1}, {"temperature": 1.0, "top_k": 20, "seed": 7}])
def test_same_seed_same_output(client, params):
    body = {"prompt": PROMPT, "max_tokens": 12, **params}
    a, b = (client.post("/generate", json=body) for _ in range(2))
    assert a.status_code == b.status_code == 200
    assert a.json()["tokens"] == b.json()["tokens"]
    assert a.json()["text"] == b.json()["text"]


def test_empty_prompt_is_allowed(client):
    r = client.post("/generate", json={"prompt": "", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["prompt_tokens"] == 1  # starts from the separator token


BAD_BODIES = [
    ({"max_tokens": 5}, 422, "prompt"),
    ({"prompt": 123}, 422, "prompt"),
    ({"prompt": ["a"]}, 422, "prompt"),
    ({"prompt": PROMPT, "max_tokens": "5"}, 422, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": 2.5}, 422, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": 0}, 422, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": 33}, 422, "max_tokens"),  # over max_tokens_limit=32
    ({"prompt": PROMPT, "temperature": -0.1}, 422, "temperature"),
    ({"prompt": PROMPT, "temperature": 2.5}, 422, "temperature"),  # the range every entry point shares: [0, 2]
    ({"prompt": PROMPT, "temperature": "hot"}, 422, "temperature"),
    ({"prompt": PROMPT, "top_p": 0}, 422, "top_p"),
    ({"prompt": PROMPT, "top_p": 1.5}, 422, "top_p"),
    ({"prompt": PROMPT, "top_k": -2}, 422, "top_k"),  # -1 is off, as in vLLM
    ({"prompt": PROMPT, "top_k": 1.5}, 422, "top_k"),
    ({"prompt": PROMPT, "seed": -1}, 422, "seed"),
    ({"prompt": PROMPT, "seed": 2**70}, 422, "seed"),
    ({"prompt": PROMPT, "stream": True}, 422, "stream"),  # extra fields are forbidden
    ([PROMPT], 422, "JSON object"),
]


@pytest.mark.parametrize("body,status,mentions", BAD_BODIES, ids=[str(b[0])[:40] for b in BAD_BODIES])
def test_bad_bodies_get_a_4xx_naming_the_problem(client, body, status, mentions):
    r = client.post("/generate", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert mentions in err["message"]
    assert err["type"] == "invalid_request_error" and err["code"]


@pytest.mark.parametrize("content,headers", [
    (b'{"prompt": "unterminated', {"content-type": "application/json"}),
    (b"{'prompt': 'single quotes'}", {"content-type": "application/json"}),
    (b'{"prompt": "x", "temperature": NaN}', {"content-type": "application/json"}),
    (b"", {"content-type": "application/json"}),
    (b"prompt=hello", {"content-type": "application/x-www-form-urlencoded"}),
    (b"\xff\xfe not utf-8", {"content-type": "application/json"}),
])
def test_malformed_bodies_get_a_4xx(client, content, headers):
    r = client.post("/generate", content=content, headers=headers)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["message"]


def test_malformed_json_is_400_with_position(client):
    r = client.post("/generate", content=b'{"prompt": ', headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "malformed_json"
    assert "malformed JSON" in r.json()["error"]["message"] and "character" in r.json()["error"]["message"]


def test_prompt_over_the_model_context_is_400_with_the_numbers(client, tokenizer, engine):
    prompt = " ".join(f"w{i}" for i in range(60))  # few chars, many tokens
    assert len(tokenizer.encode_ordinary(prompt)) >= 64
    r = client.post("/generate", json={"prompt": prompt})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    msg = r.json()["error"]["message"]
    assert "64" in msg and "tokens" in msg
    with pytest.raises(PromptTooLongError) as e:
        engine.engine.encode_prompt(prompt)
    assert msg == str(e.value)  # the engine's one rule, word for word


def test_unknown_route_and_method_use_the_error_shape(client):
    assert client.get("/nope").json()["error"]["code"] == "not_found"
    r = client.get("/generate")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_engine_failure_is_a_clean_503_without_internals(serve, faulty_engine):
    faulty_engine.fault.failing = True
    served = serve(faulty_engine)
    with httpx.Client(base_url=served.url, timeout=10) as c:
        r = c.post("/generate", json={"prompt": PROMPT})
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "engine_unavailable" and err["type"] == "server_error"
        assert "secret" not in r.text and "Traceback" not in r.text
        assert int(r.headers["retry-after"]) >= 1
        health = c.get("/health").json()
        assert health["in_flight"] == 0 and health["kv_bytes_in_use"] == 0  # nothing leaked
