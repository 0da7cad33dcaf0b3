"""Per-request timing in the answer: /generate's `timing`, the x-*-time headers, and the final streamed chunk.

Against the real server (uvicorn on 127.0.0.1), for the engine with continuous batching
and unbatched (max_num_seqs=1).
"""
import json

import httpx
import openai
import pytest
from serve_helpers import PROMPT

from tinystack.observe.timing import SEGMENTS

HEADERS = ("x-queue-time", "x-inference-time", "x-time-to-first-token", "x-total-time")


def check_timing(t: dict, tokens: int) -> None:
    """Segments add up to the total exactly; every part is measured, non-negative and inside the total."""
    for name in ("validate_ms", "queue_ms", "prefill_ms", "decode_ms", "respond_ms", "inference_ms", "ttft_ms",
                 "total_ms"):
        assert t[name] is not None and t[name] >= 0, (name, t)
    assert round(sum(t[s] for s in SEGMENTS), 2) == t["total_ms"]
    assert round(t["prefill_ms"] + t["decode_ms"], 2) == t["inference_ms"]
    assert t["validate_ms"] + t["queue_ms"] + t["prefill_ms"] <= t["ttft_ms"] + 0.011 <= t["total_ms"] + 0.011
    assert t["prefill_ms"] > 0 and t["total_ms"] > 0
    if tokens > 1:
        assert t["tpot_ms"] == pytest.approx(t["decode_ms"] / (tokens - 1), abs=0.01)
    assert t["device_ms"] > 0 and t["cpu_ms"] >= 0 and t["cost_usd"] > 0


@pytest.fixture(params=["continuous", "unbatched"])
def any_engine(request, async_engine, engine):
    return async_engine if request.param == "continuous" else engine


def test_generate_timing_object_and_headers_agree(serve, any_engine):
    s = serve(any_engine)
    r = httpx.post(f"{s.url}/generate", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    t = body["timing"]
    check_timing(t, body["completion_tokens"])
    assert float(r.headers["x-queue-time"]) == pytest.approx(t["queue_ms"] / 1e3, abs=1e-5)
    assert float(r.headers["x-inference-time"]) == pytest.approx(t["inference_ms"] / 1e3, abs=1e-5)
    assert float(r.headers["x-time-to-first-token"]) == pytest.approx(t["ttft_ms"] / 1e3, abs=1e-5)
    assert float(r.headers["x-total-time"]) >= t["total_ms"] / 1e3 - 1e-5
    assert float(r.headers["x-cost-usd"]) == pytest.approx(t["cost_usd"], rel=1e-6)


def test_every_endpoint_sends_timing_headers(serve, async_engine):
    s = serve(async_engine)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
        assert r.status_code == 200 and all(float(r.headers[h]) >= 0 for h in HEADERS)
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3})
        assert r.status_code == 200 and all(float(r.headers[h]) >= 0 for h in HEADERS)
        for r in (c.get("/health"), c.get("/v1/models"), c.post("/v1/completions", json={"prompt": 1})):
            assert float(r.headers["x-total-time"]) >= 0  # no engine parts: only what exists
            assert "x-time-to-first-token" not in r.headers


@pytest.mark.parametrize("usage", [True, False])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stream_final_chunk_carries_timing(serve, async_engine, path, usage):
    s = serve(async_engine)
    body = {"max_tokens": 5, "stream": True, "ignore_eos": True, "n": 2}
    chat = {"messages": [{"role": "user", "content": PROMPT}]}
    body.update({"prompt": PROMPT} if path == "/v1/completions" else chat)
    if usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{s.url}{path}", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert float(r.headers["x-time-to-first-token"]) > 0  # known when the headers go out
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    with_timing = [i for i, c in enumerate(chunks) if "timing" in c]
    assert with_timing == [len(chunks) - 1], "exactly the final chunk before [DONE] carries the timing"
    final = chunks[-1]
    if usage:
        assert final["choices"] == [] and final["usage"]["completion_tokens"] == 10
    else:
        assert final["choices"][0]["finish_reason"] == "length"
    check_timing(final["timing"], 5)


def test_openai_client_still_parses_a_stream_with_timing(serve, async_engine):
    s = serve(async_engine)
    with openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0) as client:
        chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=4, stream=True,
                                                stream_options={"include_usage": True}))
        chat = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                                   max_tokens=4, stream=True))
    assert chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].model_extra["timing"]["total_ms"] > 0  # an extension field: kept, not in the way
    assert chat[-1].choices[0].finish_reason in ("stop", "length")
