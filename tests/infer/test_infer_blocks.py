"""Paged KV cache bookkeeping: no leaks, prefix caching, LRU eviction, preemption, under random interleavings."""
from __future__ import annotations

import random

import pytest
import torch
from infer_helpers import ToyTokenizer

from tinystack.config import InferConfig
from tinystack.infer import LLMEngine, SamplingParams
from tinystack.infer.block_manager import BlockManager
from tinystack.infer.sequence import Sequence
from tinystack.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=211, block_size=96, n_layer=2, n_head=2, n_embd=16)).eval()


def _engine(model, **kw):
    kw = {"memory_limit_mb": 1024, "kv_block_size": 4, "max_num_seqs": 6, "max_num_batched_tokens": 16, **kw}
    return LLMEngine(model, ToyTokenizer(), InferConfig(**kw))


def _seq(tokens, rid="r"):
    return Sequence(rid, "", list(tokens), SamplingParams(temperature=0), 8)


def test_prefix_blocks_are_shared_then_cached_then_evicted_lru():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = _seq(range(10), "a")  # 2 full blocks + 2 tokens
    bm.grow(a, 10)
    a.num_computed = 10
    bm.commit(a)
    assert len(a.block_hashes) == 2 and bm.num_used_blocks == 3
    b = _seq(list(range(8)) + [99, 98, 97], "b")  # same first 8 tokens
    bm.match_prefix(b)
    assert b.num_computed == 8 and b.block_table == a.block_table[:2]
    assert bm.ref[a.block_table[0]] == 2
    c = _seq(range(8), "c")  # exactly 2 blocks: the last token must still be computed -> only 1 block shared
    bm.match_prefix(c)
    assert c.num_computed == 4
    for s in (a, b, c):
        bm.release(s)
    bm.check()
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 2 and bm.num_free_blocks == 6
    # taking every block evicts the cached ones last, least recently used first
    d = _seq(range(100, 124), "d")
    bm.grow(d, 24)
    assert bm.num_cached_blocks == 0 and not bm.by_hash
    bm.check()


def _seq_upto(tokens, max_new, rid):
    return Sequence(rid, "", list(tokens), SamplingParams(temperature=0), max_new)


def _step(bm, seq, n):
    bm.grow(seq, n)
    seq.num_computed += n
    seq.token_ids += [0] * max(0, seq.num_computed - len(seq.token_ids))


def test_a_new_sequence_starts_where_the_one_before_it_ends_at_its_max_length():
    bm = BlockManager(num_blocks=64, block_size=4)
    a = _seq_upto(range(6), 10, "a")  # max_len 16 tokens: blocks 0-3 at most
    _step(bm, a, 6)
    assert a.block_table == [0, 1]
    b = _seq_upto(range(20, 25), 3, "b")  # packed right after a's reach, not in the middle of the free run (33)
    _step(bm, b, 5)
    assert b.block_table == [4, 5]
    for _ in range(10):  # a grows to its max length and stays consecutive: one view, no gather
        _step(bm, a, 1)
    assert a.block_table == [0, 1, 2, 3]
    # a sequence that may grow past the middle of the run: the next one starts in the middle, as before
    c = _seq_upto(range(40, 44), 400, "c")
    _step(bm, c, 4)
    assert c.block_table == [6]
    d = _seq_upto(range(50, 54), 4, "d")
    _step(bm, d, 4)
    assert d.block_table == [7 + (64 - 7) // 2]
    for s in (a, b, c, d):
        bm.release(s)
    bm.check()
    assert bm.num_used_blocks == 0 and not bm.tails


def test_random_interleavings_leak_nothing_and_lose_nothing(model):
    rng = random.Random(0)
    engine = _engine(model, num_kv_blocks=20)
    prefixes = [[rng.randrange(3, 211) for _ in range(rng.choice([4, 8, 12]))] for _ in range(3)]
    live, results, aborted, prompts = set(), {}, set(), {}
    n = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.25 and n < 40:
            prompt = rng.choice(prefixes) + [rng.randrange(3, 211) for _ in range(rng.randrange(1, 20))]
            rid = f"r{n}"
            n += 1
            params = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 25), ignore_eos=True)
            engine.add_request(rid, prompt, params)
            live.add(rid)
            prompts[rid] = prompt
        elif op < 0.32 and live:
            rid = rng.choice(sorted(live))
            out = engine.abort(rid)
            assert out.finish_reason == "abort"
            live.discard(rid)
            aborted.add(rid)
        else:
            for d in engine.step():
                if d.finished:
                    results[d.request_id] = d.output
                    live.discard(d.request_id)
        engine.block_manager.check()
    while engine.has_unfinished():
        for d in engine.step():
            if d.finished:
                results[d.request_id] = d.output
                live.discard(d.request_id)
        engine.block_manager.check()
    assert not live
    assert engine.num_used_blocks == 0  # everything not in the prefix cache is free
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    assert engine.scheduler.num_preemptions > 0 and engine.block_manager.prefix_hits > 0  # both paths exercised
    # every finished request got the tokens a fresh, unpressured engine produces
    ref_engine = _engine(model, kv_block_size=16, max_num_seqs=1, enable_prefix_caching=False)
    finished = [r for r in results.values() if r.finish_reason != "abort"]
    assert len(finished) + len(aborted) == n
    for r in finished[:12]:
        params = SamplingParams(temperature=0, max_tokens=len(r.token_ids), ignore_eos=True)
        ref_engine.add_request(r.request_id, prompts[r.request_id], params)
        while ref_engine.has_unfinished():
            for d in ref_engine.step():
                if d.finished:
                    assert d.output.token_ids == r.token_ids, r.request_id


def test_preemption_recomputes_newest_and_finishes_everything(model):
    engine = _engine(model, num_kv_blocks=10, max_num_seqs=4, enable_prefix_caching=False)
    for i in range(4):  # each needs up to 8 blocks at full length; 10 blocks cannot hold them all
        engine.add_request(f"p{i}", [5 + i] * 6, SamplingParams(temperature=0, max_tokens=26, ignore_eos=True))
    outs = {}
    while engine.has_unfinished():
        for d in engine.step():
            if d.finished:
                outs[d.request_id] = d.output
    assert sorted(outs) == ["p0", "p1", "p2", "p3"]
    assert all(len(o.token_ids) == 26 and o.finish_reason == "length" for o in outs.values())
    assert engine.scheduler.num_preemptions > 0 and sum(o.num_preemptions for o in outs.values()) > 0
    assert engine.num_used_blocks == 0


def _run(engine) -> dict:
    outs = {}
    while engine.has_unfinished():
        for d in engine.step():
            if d.finished:
                outs[d.request_id] = d.output
    return outs


def test_priority_orders_admission_and_equal_priorities_stay_first_come_first_served(model):
    engine = _engine(model, max_num_seqs=1)
    for i in range(4):
        engine.add_request(f"low{i}", [5 + i] * 6, SamplingParams(temperature=0, max_tokens=3, priority=1))
    for i in range(2):  # they arrive last, but a lower priority value is served first (vLLM's convention)
        engine.add_request(f"high{i}", [9 + i] * 6, SamplingParams(temperature=0, max_tokens=3, priority=-1))
    outs = _run(engine)
    order = sorted(outs, key=lambda r: outs[r].metrics.scheduled)
    assert order == ["high0", "high1", "low0", "low1", "low2", "low3"]


def test_under_memory_pressure_the_lowest_priority_is_preempted_not_the_newest(model):
    # three sequences of 4 blocks each at full length, 10 blocks: one of them must give way once
    def preemptions(prios: dict[str, int]) -> dict[str, int]:
        engine = _engine(model, num_kv_blocks=10, max_num_seqs=4, enable_prefix_caching=False)
        for rid, prio in prios.items():
            engine.add_request(rid, [5 + int(rid[1])] * 6, SamplingParams(temperature=0, max_tokens=10,
                                                                           ignore_eos=True, priority=prio))
        outs = _run(engine)
        assert all(len(o.token_ids) == 10 for o in outs.values()) and engine.num_used_blocks == 0
        return {rid: o.num_preemptions for rid, o in outs.items()}

    fcfs = preemptions({"p0": 0, "p1": 0, "p2": 0})
    assert fcfs["p2"] > 0 and fcfs["p0"] == fcfs["p1"] == 0  # without priorities: the newest gives way
    for _ in range(5):  # the same every time: chosen by priority, not by timing
        ranked = preemptions({"p0": 0, "p1": 5, "p2": 0})
        assert ranked["p1"] > 0 and ranked["p0"] == ranked["p2"] == 0
