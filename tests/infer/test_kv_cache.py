"""Decoding through the engine's KV cache gives the logits of recomputing the whole sequence.

The engine is the one inference path: its contiguous and paged caches are checked against a
full forward over the sequence (no cache), prompt chunk by chunk, and the context limit
holds (the cache can never be written past max_seq_len)."""
import pytest
import torch
from infer_helpers import VOCAB, ToyTokenizer, random_prompts

from tinystack.config import InferConfig
from tinystack.infer import LLM, LLMEngine, PromptTooLongError, SamplingParams
from tinystack.infer.bench import Recompute, kv_cache_speedup
from tinystack.model import GPT, GPTConfig

CONTEXT = 48


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=CONTEXT, n_layer=3, n_head=4, n_embd=32)).eval()


def _llm(model, **kw):
    return LLM(model, ToyTokenizer(), memory_limit_mb=1024, max_num_seqs=4, **kw)


@torch.no_grad()
def _recompute_logprobs(model, prompt: list[int], out: list[int]) -> list[float]:
    """log p(out[i] | prompt + out[:i]) from ONE full forward over the whole sequence, no cache."""
    logits, _ = model(torch.tensor([prompt + out]))
    lp = logits[0].log_softmax(-1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]


@pytest.mark.parametrize("kv_cache", ["contiguous", "paged"])
def test_prefill_then_decode_equals_full_recompute(model, kv_cache):
    prompts = random_prompts([17, 5], seed=1)
    params = SamplingParams(temperature=0, max_tokens=CONTEXT - 17, ignore_eos=True, logprobs=0)
    outs = _llm(model, kv_cache=kv_cache).generate(prompts, params)
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == min(CONTEXT - 17, CONTEXT - len(p))  # up to the end of the context
        with torch.no_grad():
            logits, _ = model(torch.tensor([p + o.token_ids]))
        greedy = logits[0, len(p) - 1:-1].argmax(-1).tolist()
        assert o.token_ids == greedy  # every cached step chose what the full forward chooses
        assert [lp["logprob"] for lp in o.logprobs] == pytest.approx(_recompute_logprobs(model, p, o.token_ids),
                                                                     abs=1e-5)


@pytest.mark.parametrize("kv_cache", ["contiguous", "paged"])
def test_chunked_prefill_equals_full_recompute(model, kv_cache):
    """A prompt fed in chunks of 7 tokens on top of a filled cache needs the offset causal mask."""
    prompt = random_prompts([30], seed=2)[0]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    whole = _llm(model, kv_cache=kv_cache).generate([prompt], params)[0]
    chunked = _llm(model, kv_cache=kv_cache, max_num_batched_tokens=7).generate([prompt], params)[0]
    assert chunked.token_ids == whole.token_ids
    assert [lp["logprob"] for lp in chunked.logprobs] == pytest.approx(
        _recompute_logprobs(model, prompt, chunked.token_ids), abs=1e-5)


def test_engine_without_a_cache_agrees_with_the_cached_engine(model):
    """`Recompute` (the `bench kv` baseline) runs the engine over whole sequences: same tokens, same logprobs."""
    prompts = random_prompts([9, 20, 3], seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    cached = _llm(model, kv_cache="contiguous").generate(prompts, params)
    recompute = _llm(Recompute(model)).generate(prompts, params)
    for a, b in zip(cached, recompute):
        assert a.token_ids == b.token_ids
        for la, lb in zip(a.logprobs, b.logprobs):
            assert la["logprob"] == pytest.approx(lb["logprob"], abs=1e-5) and la["top"].keys() == lb["top"].keys()


def test_the_cache_is_never_written_past_the_context(model):
    eng = LLMEngine(model, ToyTokenizer(), InferConfig(kv_cache="contiguous", max_num_seqs=2, memory_limit_mb=1024))
    cfg = model.config
    # contiguous: one block of the whole context per sequence, K and V, every layer, fp32
    assert eng.storage.nbytes == 2 * cfg.n_layer * 2 * CONTEXT * cfg.n_kv_head * cfg.head_dim * 4
    with pytest.raises(PromptTooLongError, match=f"at most {CONTEXT - 1} tokens"):
        eng.add_request("full", [5] * CONTEXT, SamplingParams(max_tokens=1))
    seq = eng.add_request("near", [5] * (CONTEXT - 3), SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert seq.max_new_tokens == 3
    out = None
    while eng.has_unfinished():
        for d in eng.step():
            out = d.output or out
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


def test_bench_kv_measures_the_engine_against_recompute(model):
    res = kv_cache_speedup(model, prompt_tokens=16, new_tokens=8)
    assert res["same_tokens"] and res["kv_cache_tokens_per_s"] > 0 and res["recompute_tokens_per_s"] > 0
    assert res["speedup"] == pytest.approx(res["kv_cache_tokens_per_s"] / res["recompute_tokens_per_s"])
    with pytest.raises(ValueError, match="exceeds the model's context"):
        kv_cache_speedup(model, prompt_tokens=40, new_tokens=9)
