"""Continuous batching with chunked prefill, the dynamic batcher, the memory budget and admission."""
from __future__ import annotations

import time

import pytest
import torch
from infer_helpers import ToyTokenizer

from tinystack.config import InferConfig
from tinystack.infer import AdmissionError, LLMEngine, PromptError, PromptTooLongError, SamplingParams
from tinystack.infer.paged_cache import KVStorage
from tinystack.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(2)
    return GPT(GPTConfig(vocab_size=211, block_size=128, n_layer=2, n_head=2, n_embd=16)).eval()


def _engine(model, **kw):
    return LLMEngine(model, ToyTokenizer(), InferConfig(**{"memory_limit_mb": 1024, "kv_block_size": 8, **kw}))


def test_long_prompt_is_chunked_and_running_decodes_keep_going(model):
    engine = _engine(model, max_num_seqs=4, max_num_batched_tokens=10)
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("short", [7] * 3, greedy)
    engine.step()  # "short" prefilled and decoding
    long = engine.add_request("long", list(range(3, 103)), greedy)  # 100 tokens, 10 per step at most
    chunks = []
    while long.num_computed < 100:
        batch = engine.scheduler.schedule()
        assert sum(n for _, n in batch) <= 10
        assert ("short", 1) in [(s.request_id, n) for s, n in batch]  # the decode runs every step
        chunks += [n for s, n in batch if s.request_id == "long"]
        logits = engine.runner.run(batch)  # finish the step by hand (as LLMEngine.step does)
        for s, n in batch:
            s.num_computed += n
            engine.block_manager.commit(s)
        for s, _ in batch:
            if s.num_computed == s.num_tokens:
                s.token_ids.append(int(logits[[x for x, _ in batch].index(s)].argmax()))
    assert sum(chunks) == 100 and max(chunks) == 9  # 10-token budget minus the decode's one


def test_finished_sequences_leave_and_waiting_ones_join_next_step(model):
    engine = _engine(model, max_num_seqs=2, max_num_batched_tokens=64)
    engine.add_request("a", [5] * 4, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.add_request("b", [6] * 4, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.add_request("c", [7] * 4, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["a", "b"]  # max_num_seqs
    engine.step()  # "a" finishes here
    assert [s.request_id for s in engine.scheduler.running] == ["b"]
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["b", "c"]  # joined without waiting for "b"


def test_dynamic_batcher_flushes_on_size_or_wait_and_runs_to_completion(model):
    engine = _engine(model, scheduler="dynamic", max_num_seqs=3, max_wait_s=0.2)
    p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("a", [5] * 4, p)
    assert engine.step() == []  # 1 < max_num_seqs and max_wait not reached
    time.sleep(0.25)
    assert engine.step()  # the oldest waited max_wait: flushed
    engine.add_request("b", [6] * 4, p)
    while any(s.request_id == "a" for s in engine.scheduler.running):
        assert [s.request_id for s in engine.scheduler.running] == ["a"]  # nobody joins a running batch
        engine.step()
    for rid in "cd":
        engine.add_request(rid, [7] * 4, p)
    engine.step()  # b, c, d: max_num_seqs reached, flushed at once
    assert sorted(s.request_id for s in engine.scheduler.running) == ["b", "c", "d"]


def test_budget_follows_the_formula_and_is_described(model):
    engine = _engine(model, memory_limit_mb=20, memory_buffer=0.2, max_num_seqs=1000, max_num_batched_tokens=1000)
    b = engine.budget
    per_block = KVStorage.bytes_per_block(2, 8, 2, 8, torch.float32)
    assert b.bytes_per_block == per_block == 2 * 2 * 8 * 2 * 8 * 4
    assert b.num_blocks == int((20 * 2**20 * 0.8 - b.weight_bytes - b.overhead) // per_block)
    assert b.weight_bytes == sum(p.numel() * 4 for p in {id(p): p for p in model.parameters()}.values())
    assert b.max_concurrent_full_len == b.num_blocks // (128 // 8)
    assert engine.storage.nbytes == b.num_blocks * per_block
    assert f"{b.num_blocks} KV blocks" in engine.describe().splitlines()[0]


def test_requests_that_can_never_fit_are_refused_with_numbers(model):
    engine = _engine(model, num_kv_blocks=4)  # 32 tokens of cache
    with pytest.raises(AdmissionError, match=r"20 prompt \+ 30 new tokens = 7 KV blocks.*4 blocks"):
        engine.add_request("big", [5] * 20, SamplingParams(max_tokens=30))
    with pytest.raises(PromptTooLongError, match="128 tokens"):
        engine.add_request("huge", [5] * 200, SamplingParams(max_tokens=1))
    engine.add_request("ok", [5] * 20, SamplingParams(max_tokens=12))  # 32 tokens: fits exactly
    with pytest.raises(AdmissionError, match="no room for a single KV block"):
        _engine(model, memory_limit_mb=1, memory_buffer=0.999)  # ~1 KiB usable: not even the weights fit


def test_prompt_rules_live_in_the_engine(model):
    """encode_prompt: text or ids -> what runs; empty starts from EOS; a full context or no EOS is refused."""
    engine = _engine(model)
    tok = ToyTokenizer()
    assert engine.encode_prompt("abc") == tok.encode_ordinary("abc")
    assert engine.encode_prompt("") == engine.encode_prompt([]) == [tok.eos_token_id]
    assert engine.encode_prompt([7] * 127) == [7] * 127  # one position left for the new token
    with pytest.raises(PromptTooLongError, match="prompt is 128 tokens; .* at most 127 tokens"):
        engine.encode_prompt("x" * 128)
    seq = engine.add_request("empty", "", SamplingParams(max_tokens=2))
    assert seq.prompt_ids == [tok.eos_token_id] and seq.max_new_tokens == 2

    class NoEos(ToyTokenizer):
        eos_token_id = None
        eos_token_ids = frozenset()

    with pytest.raises(PromptError, match="empty and the tokenizer has no EOS"):
        LLMEngine(model, NoEos(), InferConfig(memory_limit_mb=1024)).add_request(None, "", SamplingParams())


def test_infer_config_section_builds_the_engine(model):
    from tinystack.config import InferConfig

    cfg = InferConfig(kv_cache="contiguous", scheduler="dynamic", max_num_seqs=3, memory_limit_mb=64, memory_buffer=0.5)
    engine = LLMEngine(model, ToyTokenizer(), cfg)
    assert engine.config is cfg and engine.scheduler.max_num_seqs == 3
    assert engine.budget.memory_limit == 64 * 2**20 and engine.budget.block_size == 128  # one block per sequence
