"""Observer: failure reasons, waiting for the engine's cost reports, and what lands in metrics and the log."""
import asyncio
import io
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tinystack.infer import RequestMetrics
from tinystack.observe import RequestTiming, setup_request_log
from tinystack.observe.metrics import EngineReading, ServeMetrics
from tinystack.observe.observer import Observer, failure_reason
from tinystack.observe.record import RequestRecord
from tinystack.observe.usage import SequenceUsage


def samples(metrics: ServeMetrics) -> dict:
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def record(status, **kw) -> RequestRecord:
    t = RequestTiming()
    for p in ("arrival", "validated", "enqueued", "scheduled", "first_token", "last_token", "returned"):
        t.mark(p)
    t.output_tokens = 3
    return RequestRecord("r", t, status=status, route="/v1/completions", generation=True, **kw)


def test_failure_reasons_from_status_or_what_the_server_knew():
    assert [failure_reason(record(s)) for s in (200, 400, 413, 422, 429, 504, 499, 503, 500, 401, 404)] == \
        [None, "validation", "validation", "validation", "overloaded", "timeout", "aborted", "engine_error",
         "engine_error", None, None]
    assert failure_reason(record(200, failure="engine_error")) == "engine_error"  # a degraded answer
    assert failure_reason(record(None)) == "aborted"  # the client left before the response started


def test_finish_waits_for_every_sequence_cost_then_records():
    out = io.StringIO()
    log = setup_request_log(None, stream=out)
    obs = Observer(ServeMetrics(), log, price_per_device_hour=3.6)

    async def scenario():
        rec = record(200, key_id="k1", finish_reasons=["length", "length"])
        rec.model = "legal"  # a LoRA adapter answered: its name labels the tokens and the cost
        usage = rec.engine_usage()
        usage.expect(2)
        stamps = (0.9, 1.0, 1.1)  # arrival, scheduled, first token
        usage.add(SequenceUsage("r-0", 5, 3, "length", RequestMetrics(*stamps, 1.2, 1.2, cpu_s=0.1, device_s=0.2)))
        obs.finish(rec)
        before = samples(obs.metrics)
        usage.add(SequenceUsage("r-1", 5, 3, "abort", RequestMetrics(*stamps, 1.3, 1.3, cpu_s=0.3, device_s=0.4)))
        return before, samples(obs.metrics)

    before, after = asyncio.run(scenario())
    log.close()
    key = ("tinystack_request_device_seconds_total", (("key_id", "k1"), ("model", "legal")))
    assert key not in before and after[key] == pytest.approx(0.6)
    assert after[("tinystack_request_cost_usd_total", (("key_id", "k1"), ("model", "legal")))] == \
        pytest.approx(0.6 * 0.001)
    assert after[("tinystack_generation_tokens_total", (("model", "legal"),))] == 6
    assert after[("tinystack_prompt_tokens_total", (("model", "legal"),))] == 10
    assert after[("tinystack_request_success_total", (("finished_reason", "length"),))] == 2
    assert after[("tinystack_e2e_request_latency_seconds_count", ())] == 1
    assert before[("tinystack_http_requests_total", (("route", "/v1/completions"), ("status", "200")))] == 1
    line = json.loads(out.getvalue())
    assert line["device_s"] == pytest.approx(0.6) and line["key_id"] == "k1" and line["failure"] is None
    assert line["model"] == "legal"


def test_an_overdue_cost_report_is_not_waited_for_forever():
    obs = Observer(ServeMetrics(), settle_timeout_s=0.05)

    async def scenario():
        rec = record(504)
        rec.engine_usage().expect(1)  # the engine never reports (it died)
        obs.finish(rec)
        await asyncio.sleep(0.2)
        return samples(obs.metrics)

    after = asyncio.run(scenario())
    assert after[("tinystack_request_failures_total", (("reason", "timeout"),))] == 1


def test_engine_counters_count_from_the_server_start():
    reading = {"r": EngineReading(1, 2, 0.5, preemptions=7, prefix_cache_hits=10, prefix_cache_queries=40)}
    metrics = ServeMetrics(lambda: reading["r"])
    metrics.engine.start()
    reading["r"] = EngineReading(3, 0, 0.25, preemptions=9, prefix_cache_hits=16, prefix_cache_queries=50)
    s = samples(metrics)
    assert s[("tinystack_num_requests_running", ())] == 3 and s[("tinystack_kv_cache_usage", ())] == 0.25
    assert s[("tinystack_num_preemptions_total", ())] == 2
    assert s[("tinystack_prefix_cache_hits_total", ())] == 6 and s[("tinystack_prefix_cache_queries_total", ())] == 10
