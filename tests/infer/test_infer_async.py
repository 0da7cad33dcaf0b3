"""AsyncEngine: streamed deltas add up to the output, abort frees everything, errors come back at once."""
from __future__ import annotations

import asyncio

import pytest
import torch
from infer_helpers import ToyTokenizer

from tinystack.config import InferConfig
from tinystack.infer import LLM, AdmissionError, AsyncEngine, LLMEngine, SamplingParams
from tinystack.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    return GPT(GPTConfig(vocab_size=211, block_size=128, n_layer=2, n_head=2, n_embd=16)).eval()


@pytest.fixture
def aengine(model):
    config = InferConfig(memory_limit_mb=1024, kv_block_size=8, max_num_seqs=4, max_num_batched_tokens=32,
                         num_kv_blocks=12)
    eng = AsyncEngine(LLMEngine(model, ToyTokenizer(), config))
    yield eng
    eng.shutdown()


def test_streams_concatenate_to_the_offline_result(model, aengine):
    prompts = ["first prompt", "second", "a third, longer prompt than the others"]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=["zz"])
    offline = LLM(model, ToyTokenizer(), memory_limit_mb=1024, max_num_seqs=4).generate(prompts, params)

    async def consume(i, p):
        text, ids, last = "", [], None
        async for d in aengine.add_request(f"r{i}", p, params):
            text, ids, last = text + d.text, ids + d.token_ids, d
        return text, ids, last

    async def main():
        return await asyncio.gather(*(consume(i, p) for i, p in enumerate(prompts)))

    for (text, ids, last), want in zip(asyncio.run(main()), offline):
        assert text == want.text and ids == want.token_ids and last.finish_reason == want.finish_reason
        m = last.output.metrics
        assert m.arrival <= m.scheduled <= m.first_token <= m.last_token
    assert aengine.num_used_blocks == 0


def test_abort_frees_every_block_and_ends_the_stream(aengine):
    async def main():
        stream = aengine.add_request("long", "x" * 30, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
        other = aengine.add_request("other", "y", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        got = 0
        async for d in stream:
            got += len(d.token_ids)
            if got >= 3 and not d.finished:
                assert aengine.num_used_blocks > 0
                aengine.abort("long")
            if d.finished:
                assert d.finish_reason == "abort" and d.output.finish_reason == "abort"
        outputs = [o async for o in other]  # drained to its final output
        return got, outputs[-1]

    got, last_other = asyncio.run(main())
    assert 3 <= got < 60 and last_other.finish_reason == "length"
    assert aengine.num_used_blocks == 0 and aengine.num_running == 0 and aengine.num_waiting == 0


def test_leaving_a_stream_early_aborts_it(aengine):
    async def main():
        stream = aengine.add_request("gone", "z" * 10, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()  # what a disconnecting client's handler does
        for _ in range(200):
            if aengine.num_used_blocks == 0 and aengine.num_running == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())


def test_impossible_requests_raise_in_the_caller(aengine):
    async def main():
        with pytest.raises(AdmissionError, match="KV blocks"):
            aengine.add_request("big", "p" * 90, SamplingParams(max_tokens=20))  # 110 tokens > 12 blocks x 8
        out = await aengine.generate("fine", "p", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        return out

    assert len(asyncio.run(main()).token_ids) == 3
