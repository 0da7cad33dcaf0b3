"""The default time limit follows the model's measured speed (serve/engine/deadline.py): a load that takes longer
than any fixed limit chosen on a faster machine is served whole, while a fixed [serve] timeout_s still cuts it
and a request's own timeout still lowers it."""
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
from serve_helpers import PROMPT

from tinystack.infer.step_stats import StepRecord
from tinystack.serve.engine.deadline import FIRST_S, FLOOR_S, SLACK, StepMeter, request_timeout_s


def _stats(step_s, prefill=None, running=0, waiting=0, max_num_seqs=4):
    return SimpleNamespace(step_s=step_s, prefill_s_per_token=prefill, running=running, waiting=waiting,
                           max_num_seqs=max_num_seqs)


def test_the_rule_grows_with_the_work_the_queue_and_the_measured_step():
    base = request_timeout_s(0, 64, _stats(0.1, 0.001), prompt_tokens=100, max_tokens=32)
    assert base == SLACK * (100 * 0.001 + 32 * 0.1) + FLOOR_S
    assert request_timeout_s(0, 64, _stats(0.2, 0.001), 100, 32) > base  # a slower engine, a longer limit
    assert request_timeout_s(0, 64, _stats(0.1, 0.001), 100, 64) > base  # more tokens asked
    queued = request_timeout_s(0, 64, _stats(0.1, 0.001, running=4, waiting=5), 100, 32)
    assert queued == base + SLACK * 2 * 64 * 0.1  # two full batches before its turn, each up to 64 steps
    assert request_timeout_s(0, 64, _stats(None), 100, 32) == FIRST_S  # nothing measured yet
    assert request_timeout_s(3.0, 64, _stats(0.1), 100, 32) == 3.0  # a fixed limit replaces the rule
    assert request_timeout_s(0, 64, _stats(0.1), 100, 32, asked=0.5) == 0.5  # a request may ask for less


def test_the_meter_reads_the_slowest_recent_decode_step_and_prefill_rate():
    meter = StepMeter()
    assert meter.step_s is None and meter.prefill_s_per_token is None
    meter(StepRecord(batch_size=2, num_tokens=2, prefill_tokens=0, wall_s=0.03, cpu_s=0.0, end=0.0))
    meter(StepRecord(batch_size=1, num_tokens=100, prefill_tokens=100, wall_s=0.5, cpu_s=0.0, end=0.0))
    meter(StepRecord(batch_size=2, num_tokens=2, prefill_tokens=0, wall_s=0.01, cpu_s=0.0, end=0.0))
    assert meter.step_s == 0.03 and meter.prefill_s_per_token == 0.005
    for _ in range(64):  # the window moves on: an old slow step is forgotten
        meter(StepRecord(batch_size=2, num_tokens=2, prefill_tokens=0, wall_s=0.01, cpu_s=0.0, end=0.0))
    assert meter.step_s == 0.01


def _load(url: str, n: int, max_tokens: int) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: httpx.post(f"{url}/v1/completions", timeout=60, json={
            "prompt": f"{PROMPT} {i}", "max_tokens": max_tokens, "ignore_eos": True}), range(n)))


@pytest.mark.parametrize("faulty_engine", ["continuous"], indirect=True)  # batching: the queue is what waits
def test_a_slow_machines_load_is_served_whole_by_default_and_cut_by_a_fixed_limit(serve, faulty_engine):
    faulty_engine.fault.delay_s = 0.03  # every engine step: a slow machine
    served = serve(faulty_engine, max_num_seqs=2, max_queued_requests=8)  # timeout_s: the default, 0
    assert served.state.cfg.timeout_s == 0
    assert httpx.post(f"{served.url}/v1/completions", timeout=60, json={  # the engine measures its speed
        "prompt": PROMPT, "max_tokens": 4}).status_code == 200
    # 6 requests x 24 tokens, 2 at a time: ~3 rounds of 24 steps of 30 ms, over 2 s for the last ones
    answers = _load(served.url, 6, 24)
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers if r.status_code != 200]
    assert all(r.json()["usage"]["completion_tokens"] == 24 for r in answers)
    fixed = serve(faulty_engine, max_num_seqs=2, max_queued_requests=8, timeout_s=1.0)
    cut = _load(fixed.url, 6, 24)
    assert 504 in {r.status_code for r in cut}  # the same load under a fixed 1 s limit: the last ones are cut
