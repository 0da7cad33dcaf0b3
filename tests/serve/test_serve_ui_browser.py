"""The playground and the dashboard in a real browser: headless Chromium driven by Playwright.

A real server (uvicorn on 127.0.0.1, tiny random GPT) and Debian's `chromium`
(`executable_path`, no browser download: the machine has no internet). Checks what a
person would look at: the streamed answer appears and is the answer the API gives for
the same seed without streaming; the timing bar appears with non-negative segments that
add up to its total; the dashboard's figures turn from a dash into numbers once traffic
arrives. The page's own helpers (Prometheus parsing, histogram quantiles, timing
sources) are checked in the same browser against values worked out by hand here.

The playground's chat mode is checked turn by turn against /v1/chat/completions (the conversation so far sent
each turn; a failed turn leaves it as it was), and with the real SmolLM2-135M-Instruct served from its
imported directory: it answers a question in the browser.

Needs: `pip install playwright` and `/usr/bin/chromium` (`apt-get install -y chromium`),
or TINYSTACK_CHROMIUM pointing at another Chromium binary.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import torch
from playwright.sync_api import Browser, Page, expect, sync_playwright
from serve_helpers import PROMPT

from tinystack.config import InferConfig
from tinystack.infer import LLMEngine
from tinystack.infer.async_engine import AsyncEngine
from tinystack.model import GPT, GPTConfig

CHROMIUM = os.environ.get("TINYSTACK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KEY = "ui-test-key"
NUMBER = re.compile(r"^\d+(\.\d+)?( ms| s)?$")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (or set TINYSTACK_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))  # an uncaught exception in the page's scripts
    yield pg
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def test_playground_streams_the_answer_and_shows_the_timing_bar(serve, async_engine, page, monkeypatch):
    monkeypatch.setenv("TS_UI_BROWSER_KEYS", KEY)
    s = serve(async_engine, api_key_env="TS_UI_BROWSER_KEYS")
    params = {"max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234}
    page.goto(s.url + "/")
    page.check("#mode-complete")  # the prompt as it is, continued (chat is the default)
    expect(page.locator("#chat-only")).to_be_hidden()
    page.fill("#prompt", PROMPT)
    for name, value in params.items():
        page.fill(f"#{name}", str(value))

    page.click("#send")  # no key yet: the server's 401 is shown, not swallowed
    expect(page.locator("#status")).to_have_attribute("data-state", "error", timeout=15_000)
    expect(page.locator("#error")).to_contain_text("401")

    page.fill("#api-key", KEY)
    page.click("#send")
    expect(page.locator("#status")).to_have_attribute("data-state", "done", timeout=30_000)
    streamed = page.locator("#output").text_content()
    assert page.locator("#error").is_hidden()

    with httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, **params})
    assert r.status_code == 200, r.text
    assert streamed, "the playground showed no answer"
    assert streamed == r.json()["choices"][0]["text"]
    expect(page.locator("#status")).to_contain_text(f"{r.json()['usage']['completion_tokens']} generated tokens")

    expect(page.locator("#timing")).to_be_visible()
    segments = page.locator("#timing-bar [data-segment]")
    names = [segments.nth(i).get_attribute("data-segment") for i in range(segments.count())]
    ms = [float(segments.nth(i).get_attribute("data-ms")) for i in range(segments.count())]
    total = float(page.locator("#timing-bar").get_attribute("data-total-ms"))
    assert {"queue", "prefill", "decode"} <= set(names), names
    assert all(x >= 0 and math.isfinite(x) for x in ms), dict(zip(names, ms))
    assert total > 0 and math.isclose(sum(ms), total, rel_tol=1e-6, abs_tol=0.01), (names, ms, total)
    expect(page.locator("#timing-legend")).to_contain_text("decode")
    # the server's own split (the final chunk's `timing`), not the browser's clock
    expect(page.locator("#timing-source")).to_have_text("from: server")


def _chat_turn(page: Page, message: str) -> str:
    """Type a message, send it, wait for the whole answer; returns the streamed answer."""
    page.fill("#prompt", message)
    page.click("#send")
    expect(page.locator("#status")).to_have_attribute("data-state", re.compile("done|error"), timeout=60_000)
    return page.locator("#output").text_content()


def _turns(page: Page) -> list[tuple[str, str]]:
    turns = page.locator("#conversation .turn")
    return [(turns.nth(i).get_attribute("data-role"), turns.nth(i).text_content()) for i in range(turns.count())]


@pytest.fixture
def chat_engine(tokenizer) -> Iterator[AsyncEngine]:
    """The tiny random GPT with a context of 256 tokens (the shared one has 64): room for a conversation."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=256, n_layer=2, n_head=2, n_embd=32))
    engine = AsyncEngine(LLMEngine(model, tokenizer, InferConfig(max_num_seqs=4, num_kv_blocks=96)))
    yield engine
    engine.shutdown()


def test_playground_chat_sends_the_conversation_each_turn(serve, chat_engine, page, monkeypatch):
    """Chat mode (the default): each turn's streamed answer is what /v1/chat/completions answers, without
    streaming, for the system message, every earlier turn and the new message; a failed turn (no key) leaves
    the conversation and the typed message as they were; New chat starts over."""
    monkeypatch.setenv("TS_UI_BROWSER_KEYS", KEY)
    s = serve(chat_engine, api_key_env="TS_UI_BROWSER_KEYS")
    params = {"max_tokens": 10, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 77}
    page.goto(s.url + "/")
    expect(page.locator("#mode-chat")).to_be_checked()
    expect(page.locator("#chat-only")).to_be_visible()
    for name, value in params.items():
        page.fill(f"#{name}", str(value))
    page.fill("#system", "be brief")

    assert _chat_turn(page, "hello there") == ""  # no key yet: 401 shown, nothing joins the conversation
    expect(page.locator("#error")).to_contain_text("401")
    assert _turns(page) == [] and page.input_value("#prompt") == "hello there"

    page.fill("#api-key", KEY)
    messages = [{"role": "system", "content": "be brief"}]
    with httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as c:
        for text in ("hello there", PROMPT, "and then?"):
            streamed = _chat_turn(page, text)
            assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
            messages.append({"role": "user", "content": text})
            r = c.post("/v1/chat/completions", json={"messages": messages, **params})
            assert r.status_code == 200, r.text
            answer = r.json()["choices"][0]["message"]["content"]
            assert streamed == answer, (messages, streamed, answer)
            messages.append({"role": "assistant", "content": answer})
            assert page.input_value("#prompt") == ""  # the box is free for the next turn
            assert _turns(page) == [(m["role"], m["content"]) for m in messages[1:]]
    assert any(m["content"] for m in messages if m["role"] == "assistant"), "every answer was empty"
    expect(page.locator("#timing-source")).to_have_text("from: server")

    page.click("#new-chat")
    assert _turns(page) == [] and page.locator("#output").text_content() == ""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "and then?"}]
    streamed = _chat_turn(page, "and then?")  # a new conversation: this message alone after the system one
    with httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/chat/completions", json={"messages": messages, **params})
    assert streamed == r.json()["choices"][0]["message"]["content"]


def test_playground_chats_with_the_real_smollm2(serve, smollm2_dir, page):
    """The real SmolLM2-135M-Instruct served from its imported directory (its chat template): asked in the
    playground, greedily, it names the capital; the turn ends at <|im_end|>, which is not shown."""
    from tinystack.infer import load_for_inference

    model, tok = load_for_inference(smollm2_dir, InferConfig(weight_format="float32"))
    engine = AsyncEngine(LLMEngine(model, tok, InferConfig(max_num_seqs=2, memory_limit_mb=1024)))
    try:
        s = serve(engine, model_dir=smollm2_dir)
        page.goto(s.url + "/")
        page.fill("#temperature", "0")
        page.fill("#max_tokens", "24")
        answer = _chat_turn(page, "What is the capital of Japan?")
        assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
        assert "Tokyo" in answer and "<|im_" not in answer, answer
        assert _turns(page) == [("user", "What is the capital of Japan?"), ("assistant", answer)]
    finally:
        engine.shutdown()


def test_dashboard_figures_turn_into_numbers_with_traffic(serve, async_engine, page):
    s = serve(async_engine)
    page.goto(s.url + "/dashboard")
    expect(page.locator("#poll-status")).to_have_attribute("data-state", "ok", timeout=10_000)
    expect(page.locator("#running")).to_have_text(NUMBER)
    expect(page.locator("#waiting")).to_have_text(NUMBER)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        for seed in range(4):
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "seed": seed, "ignore_eos": True})
            assert r.status_code == 200, r.text
    for figure in ("#e2e-p50", "#e2e-p90", "#e2e-p99", "#ttft-p50", "#batch", "#tps", "#kv", "#errors"):
        expect(page.locator(figure)).to_have_text(NUMBER, timeout=10_000)
    expect(page.locator("#latency-note")).to_contain_text("4 requests")
    assert float(page.locator("#errors").text_content()) == 0
    assert page.locator("#spark-load polyline").get_attribute("points")


def test_dashboard_without_access_shows_dashes_then_recovers_with_the_key(serve, async_engine, page, monkeypatch):
    monkeypatch.setenv("TS_UI_BROWSER_KEYS", KEY)
    s = serve(async_engine, api_key_env="TS_UI_BROWSER_KEYS", open_health=False)  # /metrics wants the key
    page.goto(s.url + "/dashboard")
    expect(page.locator("#poll-status")).to_have_attribute("data-state", "error", timeout=10_000)
    expect(page.locator("#poll-status")).to_contain_text("401")
    for figure in ("#running", "#waiting", "#kv", "#batch", "#tps", "#errors", "#e2e-p50", "#ttft-p99"):
        expect(page.locator(figure)).to_have_text("\u2014")
    page.fill("#api-key", KEY)  # the next poll sends it
    expect(page.locator("#poll-status")).to_have_attribute("data-state", "ok", timeout=10_000)
    expect(page.locator("#running")).to_have_text(NUMBER)


# --- the pages' helpers, run in the browser ---------------------------------------------------

EXPOSITION = """\
# HELP lat_seconds latency
# TYPE lat_seconds histogram
lat_seconds_bucket{le="0.01",route="a"} 2
lat_seconds_bucket{le="0.02",route="a"} 6
lat_seconds_bucket{le="+Inf",route="a"} 8
lat_seconds_sum{route="a"} 0.5
lat_seconds_count{route="a"} 8
lat_seconds_bucket{le="0.01",route="b"} 0
lat_seconds_bucket{le="0.02",route="b"} 2
lat_seconds_bucket{le="+Inf",route="b"} 2
lat_seconds_sum{route="b"} 0.03
lat_seconds_count{route="b"} 2
# TYPE fails_total counter
fails_total{reason="timeout"} 3
fails_total{reason="over\\"loaded"} 1.5e0
# TYPE empty_total counter
running 4 1700000000000
"""


def run_module(page: Page, module: str, body: str):
    """Evaluate `body` (an async function body that may use `mod`) with the page's module `module`."""
    return page.evaluate(f"async () => {{ const mod = await import('/ui/{module}'); {body} }}")


def test_prometheus_helpers_in_the_browser(serve, engine, page):
    s = serve(engine)
    page.goto(s.url + "/")
    got = run_module(page, "prom.js", f"""
        const m = mod.parseMetrics({EXPOSITION!r});
        const h = mod.histogram(m, "lat_seconds");
        const prev = {{buckets: [[0.01, 1], [0.02, 2], [Infinity, 2]], sum: 0.02, count: 2}};
        const d = mod.histogramDelta(h, prev);
        return {{h: {{...h, buckets: h.buckets.map(([le, c]) => [String(le), c])}},
                 p25: mod.quantile(0.25, h), p50: mod.quantile(0.5, h), p99: mod.quantile(0.99, h),
                 delta: {{count: d.count, sum: d.sum, buckets: d.buckets.map(([, c]) => c)}},
                 reset: mod.histogramDelta(prev, h) === prev, none: mod.quantile(0.5, null),
                 fails: mod.byLabel(m, "fails_total", "reason"), failsTotal: mod.total(m, "fails_total"),
                 emptyExposed: mod.hasMetric(m, "empty_total"), missing: mod.hasMetric(m, "nope"),
                 missingTotal: mod.total(m, "nope"), running: mod.total(m, "running")}};
    """)
    # buckets of both routes added: (0.01: 2, 0.02: 8, +Inf: 10), sum 0.53, count 10
    assert got["h"] == {"buckets": [["0.01", 2], ["0.02", 8], ["Infinity", 10]], "sum": 0.53, "count": 10}
    assert math.isclose(got["p25"], 0.01 + 0.01 * (2.5 - 2) / 6)  # rank 2.5 lies in (0.01, 0.02]
    assert math.isclose(got["p50"], 0.01 + 0.01 * (5 - 2) / 6)
    assert got["p99"] == 0.02  # rank 9.9 is in the +Inf bucket: the highest finite bound
    assert got["delta"]["count"] == 8 and got["delta"]["buckets"] == [1, 6, 8]
    assert math.isclose(got["delta"]["sum"], 0.51)
    assert got["reset"] and got["none"] is None
    assert got["fails"] == {"timeout": 3, 'over"loaded': 1.5} and got["failsTotal"] == 4.5
    assert got["emptyExposed"] and not got["missing"] and got["missingTotal"] is None
    assert got["running"] == 4  # a trailing timestamp is not the value


def test_timing_sources_in_the_browser(serve, engine, page):
    s = serve(engine)
    page.goto(s.url + "/")
    got = run_module(page, "timing.js", """
        const H = (o) => new Headers(o);
        const seg = (t) => Object.fromEntries(t.segments.map((s) => [s.name, +s.ms.toFixed(6)]));
        const client = {ttft_ms: 30, total_ms: 100};
        const server = mod.resolveTiming({queue_ms: 2, prefill_ms: 5, decode_ms: 40, ttft_ms: 8, total_ms: 50},
                                         H({"x-queue-time": "0.5"}), client);
        const headers = mod.resolveTiming(null, H({"x-queue-time": "0.002", "x-time-to-first-token": "0.010",
                                                   "x-inference-time": "0.048", "x-total-time": "0.060"}), client);
        const only = mod.resolveTiming(undefined, H({}), client);
        const odd = mod.resolveTiming({queue_ms: -1, decode_ms: "x"}, H({"x-queue-time": "abc"}), client);
        return {server: [seg(server), server.total_ms, server.sources.queue_ms],
                headers: [seg(headers), headers.total_ms, headers.ttft_ms],
                only: [seg(only), only.total_ms, only.sources.total_ms], odd: [seg(odd), odd.total_ms]};
    """)
    # the final chunk's timing wins over headers and the client; 3 ms of the total are "other"
    assert got["server"] == [{"queue": 2, "prefill": 5, "decode": 40, "other": 3}, 50, "server"]
    # headers: prefill = ttft - queue = 8, decode = inference - prefill = 40, other = 60 - 50
    assert got["headers"] == [{"queue": 2, "prefill": 8, "decode": 40, "other": 10}, 60, 10]
    # the browser alone: no queue; prefill = time to the first chunk, decode = the rest
    assert got["only"] == [{"prefill": 30, "decode": 70}, 100, "client"]
    # nonsense is clamped or ignored, never negative: queue 0, prefill 30, decode 70
    assert got["odd"] == [{"queue": 0, "prefill": 30, "decode": 70}, 100]
