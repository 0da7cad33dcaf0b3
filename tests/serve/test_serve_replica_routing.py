"""The replica routing policies (serve/replicas/routing.py), pure functions: no Ray needed.

Prefix hashes are held against the engine's own prefix cache: the blocks a real engine caches for a
prompt are the ones `prompt_block_hashes` names, so the gateway and the replicas agree on what a hit is.
"""
import random

import pytest

from tinystack.config import InferConfig
from tinystack.infer import LLMEngine
from tinystack.infer.sampler import SamplingParams
from tinystack.observe.metrics import EngineCollector, EngineReading
from tinystack.serve.replicas.routing import (
    ReplicaView,
    least_loaded,
    order,
    prefix_aware,
    prefix_match,
    prompt_block_hashes,
    round_robin,
)


def test_least_loaded_orders_by_load_then_id():
    views = [ReplicaView("b", 3), ReplicaView("a", 3), ReplicaView("c", 0)]
    assert least_loaded(views) == ["c", "a", "b"]
    assert least_loaded([]) == []


def test_round_robin_rotates_blind_to_load():
    views = [ReplicaView("a", 100), ReplicaView("b", 0), ReplicaView("c", 0)]
    assert [round_robin(views, i)[0] for i in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert sorted(round_robin(views, 1)) == ["a", "b", "c"]  # a full order, for Serve to fall back on


def test_prefix_hashes_are_chained_over_full_blocks_only():
    ids = list(range(40))
    h = prompt_block_hashes(ids, 16)
    assert len(h) == 2  # 40 tokens = 2 full blocks of 16 (the partial one is never cached)
    assert prompt_block_hashes(ids[:32] + [999] * 8, 16) == h  # same first blocks, same hashes
    other = prompt_block_hashes([7] + ids[1:], 16)
    assert other[0] != h[0] and other[1] != h[1]  # a change in block 0 changes every later hash (a prefix)
    assert len(prompt_block_hashes(list(range(16 * 100)), 16, max_blocks=8)) == 8


def test_prefix_match_counts_the_leading_run():
    assert prefix_match([1, 2, 3], {1, 2, 3}) == 3
    assert prefix_match([1, 2, 3], {1, 3}) == 1
    assert prefix_match([1, 2, 3], {2, 3}) == 0
    assert prefix_match([], {1}) == 0


def test_prefix_aware_prefers_the_cache_holder_unless_overloaded():
    hashes = [11, 12, 13]
    holder = ReplicaView("h", 5, {11, 12, 13})
    partial = ReplicaView("p", 0, {11})
    idle = ReplicaView("i", 0)
    assert prefix_aware([holder, partial, idle], hashes, overload=5)[0] == "h"  # 5 <= 0 + 5: still preferred
    assert prefix_aware([holder, partial, idle], hashes, overload=4)[0] in ("i", "p")  # overloaded: least loaded
    assert prefix_aware([partial, idle], hashes, overload=4)[0] == "p"  # a partial hit beats none
    assert prefix_aware([ReplicaView("x", 2), idle], hashes, overload=4) == ["i", "x"]  # no hit: least loaded
    assert prefix_aware([holder, idle], [], overload=4) == ["i", "h"]  # no full block: least loaded
    ranked = prefix_aware([holder, partial, idle], hashes, overload=8)
    assert sorted(ranked) == ["h", "i", "p"] and ranked[1:] == ["i", "p"]  # the rest by load


def test_order_dispatches_and_rejects_unknown_policies():
    views = [ReplicaView("a", 1, {5}), ReplicaView("b", 0)]
    assert order("least_loaded", views) == ["b", "a"]
    assert order("prefix", views, hashes=[5]) == ["a", "b"]
    assert order("round_robin", views, counter=1) == ["b", "a"]
    with pytest.raises(ValueError, match="unknown routing policy"):
        order("random", views)


def test_prefix_hashes_match_what_the_engine_caches(tokenizer, tiny_model):
    """The gateway's hashes of a prompt are exactly the block hashes the engine registers for it."""
    engine = LLMEngine(tiny_model, tokenizer, InferConfig(max_num_seqs=2, num_kv_blocks=32, kv_block_size=8))
    rng = random.Random(0)
    prompt = [rng.randrange(tokenizer.vocab_size) for _ in range(37)]
    engine.add_request("r", prompt, SamplingParams(max_tokens=2, temperature=0.0))
    while engine.has_unfinished():
        engine.step()
    cached = set(engine.block_manager.by_hash)
    hashes = prompt_block_hashes(prompt, 8)
    assert len(hashes) == 4 and prefix_match(hashes, cached) == 4
    assert prefix_match(prompt_block_hashes([prompt[0] + 1] + prompt[1:], 8), cached) == 0


def test_engine_metrics_per_replica_carry_a_replica_label():
    readings = {"r1": EngineReading(2, 1, 0.5, 0, 10, 20), "r2": EngineReading(0, 0, 0.0)}
    families = {f.name: f for f in EngineCollector(lambda: readings).collect()}
    running = {s.labels["replica"]: s.value for s in families["tinystack_num_requests_running"].samples}
    assert running == {"r1": 2, "r2": 0}
    hits = {s.labels["replica"]: s.value for s in families["tinystack_prefix_cache_hits"].samples
            if s.name.endswith("_total")}
    assert hits == {"r1": 10, "r2": 0}
