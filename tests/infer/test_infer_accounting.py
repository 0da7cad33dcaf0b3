"""Step accounting: every step is recorded, its seconds are shared by tokens and add up exactly;
streamed deltas carry their logprobs as they go; the async engine reports its own liveness."""
from __future__ import annotations

import asyncio
import math

import pytest
import torch
from infer_helpers import ToyTokenizer

from tinystack.config import InferConfig
from tinystack.infer import AsyncEngine, LLMEngine, SamplingParams
from tinystack.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(5)
    return GPT(GPTConfig(vocab_size=211, block_size=128, n_layer=2, n_head=2, n_embd=16)).eval()


def _engine(model, **kw):
    return LLMEngine(model, ToyTokenizer(), InferConfig(memory_limit_mb=1024, kv_block_size=8, max_num_seqs=4,
                                                        max_num_batched_tokens=24, num_kv_blocks=40, **kw))


def test_request_shares_add_up_to_the_steps(model):
    eng = _engine(model)
    records = []
    eng.step_listeners.append(records.append)
    prompts = ["a" * 30, "bb", "a prompt of middling size"]
    for i, (p, m) in enumerate(zip(prompts, [9, 7, 8])):  # r1's steps are a subset of r0's
        eng.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
    outputs = {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.output is not None:
                outputs[d.request_id] = d.output
    assert len(records) == eng.counters.steps > 0
    # tokens fed: every prompt token once (chunked), then one per decode step
    fed = sum(r.num_tokens for r in records)
    n_out = sum(len(o.token_ids) for o in outputs.values())
    assert fed == sum(len(o.prompt_token_ids) for o in outputs.values()) + n_out - len(outputs)
    assert sum(r.prefill_tokens for r in records) == eng.counters.prompt_tokens == sum(
        len(o.prompt_token_ids) for o in outputs.values())
    assert eng.counters.generation_tokens == n_out
    assert max(r.batch_size for r in records) > 1  # requests really shared steps
    assert math.isclose(sum(o.metrics.cpu_s for o in outputs.values()), sum(r.cpu_s for r in records), rel_tol=1e-9)
    assert math.isclose(sum(o.metrics.device_s for o in outputs.values()), sum(r.wall_s for r in records),
                        rel_tol=1e-9)
    assert all(o.metrics.device_s > 0 for o in outputs.values())
    # r0 fed at least as many tokens as r1 in every step r1 was in, and ran in more steps: it paid more
    assert outputs["r0"].metrics.device_s > outputs["r1"].metrics.device_s
    m = outputs["r2"].metrics
    assert m.arrival <= m.scheduled <= m.first_token <= m.last_token <= m.finished
    assert m.prefill_s == pytest.approx(m.first_token - m.scheduled)


def test_aborted_request_keeps_what_it_cost(model):
    eng = _engine(model)
    eng.add_request("x", "some prompt", SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(3):
        eng.step()
    out = eng.abort("x")
    assert out.finish_reason == "abort" and out.metrics.cpu_s > 0 and out.metrics.device_s > 0
    assert out.metrics.device_s == pytest.approx(eng.counters.wall_s)


def test_prefix_cache_hits_and_queries(model):
    eng = _engine(model)
    prompt = "shared prefix " * 3  # 42 tokens: several full blocks of 8
    for rid in ("p1", "p2"):
        eng.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
    assert eng.prefix_cache_query_tokens == 2 * len(prompt)
    assert eng.prefix_cache_hit_tokens == (len(prompt) - 1) // 8 * 8  # the second request's full blocks


def test_streamed_deltas_carry_logprobs_and_liveness(model):
    eng = AsyncEngine(_engine(model))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)

    async def main():
        got = []
        async for d in eng.add_request("lp", "hello", params):
            got.append(d)
        return got

    try:
        assert eng.is_alive() and eng.last_step_age_s() >= 0
        deltas = asyncio.run(main())
        streamed = [lp for d in deltas for lp in (d.logprobs or [])]
        final = deltas[-1].output
        assert len(deltas) > 1 and all(len(d.logprobs or []) == len(d.token_ids) for d in deltas)
        assert streamed == final.logprobs and len(streamed) == len(final.token_ids) == 6
    finally:
        eng.shutdown()
    assert not eng.is_alive()
