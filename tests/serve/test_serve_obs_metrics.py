"""GET /metrics (Prometheus text, parsed with prometheus_client's parser) moves as expected after known traffic."""
import threading

import httpx
import pytest
from obs_helpers import scrape, total, value
from serve_helpers import PROMPT, wait_for

LATENCY = ("tinystack_time_to_first_token_seconds", "tinystack_time_per_output_token_seconds",
           "tinystack_e2e_request_latency_seconds", "tinystack_request_queue_time_seconds",
           "tinystack_request_prefill_time_seconds", "tinystack_request_decode_time_seconds")


def test_metrics_after_known_traffic(serve, async_engine, tokenizer):
    s = serve(async_engine)
    prompt_len = len(tokenizer.encode_ordinary(PROMPT))
    with httpx.Client(base_url=s.url, timeout=30) as c:
        before = scrape(s.url)
        for seed in range(3):
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True, "seed": seed})
            assert r.status_code == 200
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True, "n": 2})
        assert r.status_code == 200
        assert c.post("/generate", json={"prompt": PROMPT, "max_tokens": 2, "top_p": 2}).status_code == 422
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10_000}).status_code == 400
        assert c.get("/no/such/path/123").status_code == 404
        assert c.get("/metrics.json").json()["counters"]["timeouts"] == 0  # the JSON view is still there
        served = c.get("/v1/models").json()["data"][0]["id"]  # the label of its tokens and cost
    after = scrape(s.url)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    for name in LATENCY:  # one observation per successful request
        assert delta(f"{name}_count") == 4, name
        assert delta(f"{name}_sum") > 0 or name == "tinystack_request_queue_time_seconds", name
    assert delta("tinystack_request_success_total", finished_reason="length") == 5  # 3 + n=2
    assert delta("tinystack_request_failures_total", reason="validation") == 2
    assert sum(delta("tinystack_request_failures_total", reason=r) for r in
               ("overloaded", "timeout", "aborted", "engine_error")) == 0
    assert delta("tinystack_generation_tokens_total", model=served) == 3 * 4 + 2 * 3
    assert delta("tinystack_prompt_tokens_total", model=served) == 5 * prompt_len
    assert delta("tinystack_http_requests_total", route="/v1/completions", status=200) == 4
    assert delta("tinystack_http_requests_total", route="/v1/completions", status=400) == 1
    assert delta("tinystack_http_requests_total", route="/generate", status=422) == 1
    assert delta("tinystack_http_requests_total", route="other", status=404) == 1  # not the raw path
    assert not any("/no/such" in str(lab) for _, lab in after)
    # one batch-size observation per engine step; the steps of this server are all the engine's steps
    assert value(after, "tinystack_batch_size_count") == async_engine.engine.counters.steps
    assert value(after, "tinystack_batch_size_sum") >= value(after, "tinystack_batch_size_count")
    # gauges read at scrape time; the engine is idle now
    assert value(after, "tinystack_num_requests_running") == 0
    assert value(after, "tinystack_num_requests_waiting") == 0
    assert 0.0 <= value(after, "tinystack_kv_cache_usage") <= 1.0
    assert value(after, "tinystack_prefix_cache_queries_total") >= 5 * prompt_len - prompt_len
    assert total(after, "tinystack_request_cost_usd_total", key_id="anonymous", model=served) > 0


@pytest.mark.parametrize("faulty_engine", ["continuous"], indirect=True)  # the engine's own queue
def test_gauges_show_running_and_waiting_while_busy(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.05
    s = serve(faulty_engine, max_num_seqs=8, timeout_s=30)
    faulty_engine.engine.scheduler.max_num_seqs = 2  # 2 run, the others wait in the engine
    done = []

    def send(i):
        done.append(httpx.post(f"{s.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 20,
                                                                "ignore_eos": True, "seed": i}, timeout=60))
    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    seen = []
    assert wait_for(lambda: (seen.append(scrape(s.url)) or
                             (value(seen[-1], "tinystack_num_requests_running") == 2 and
                              value(seen[-1], "tinystack_num_requests_waiting") >= 1)), timeout=20)
    assert value(seen[-1], "tinystack_kv_cache_usage") > 0
    for t in threads:
        t.join(60)
    assert [r.status_code for r in done] == [200] * 4


def test_each_app_has_its_own_registry(serve, async_engine):
    a = serve(async_engine)
    b = serve(async_engine, rate_limit_tpm=10)  # a second server on the same engine
    r = httpx.post(f"{a.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200
    r = httpx.post(f"{b.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 20}, timeout=30)
    assert r.status_code == 429  # more tokens than a minute allows: overloaded
    ma, mb = scrape(a.url), scrape(b.url)
    assert value(ma, "tinystack_e2e_request_latency_seconds_count") == 1
    assert value(mb, "tinystack_e2e_request_latency_seconds_count") == 0
    assert value(mb, "tinystack_request_failures_total", reason="overloaded") == 1
    assert value(ma, "tinystack_request_failures_total", reason="overloaded") == 0
