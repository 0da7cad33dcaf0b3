"""Every SamplingParams knob, per request, in mixed batches through the engine."""
from __future__ import annotations

import pytest
import torch
from infer_helpers import ToyTokenizer

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.sampler import SampleRow, apply_penalties, min_p_filter, sample_batch
from tinystack.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def llm():
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=211, block_size=128, n_layer=2, n_head=2, n_embd=16)).eval()
    return LLM(model, ToyTokenizer(), memory_limit_mb=1024, max_num_seqs=8, kv_block_size=8)


def test_penalties_match_their_definitions():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    rep = apply_penalties(logits, SamplingParams(repetition_penalty=2.0), prompt_ids=[0], output_ids=[1])
    assert rep.tolist() == [1.0, -2.0, 0.5, 3.0]  # positive / p, negative * p, unseen unchanged
    pf = apply_penalties(logits, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [0], [3, 3, 2])
    assert pf.tolist() == [2.0, -1.0, 0.5 - 0.5 - 0.25, 3.0 - 0.5 - 0.5]  # prompt tokens are not penalised
    kept = ~torch.isinf(min_p_filter(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 0.2))
    assert kept.tolist() == [[True, True, True, False]]  # 0.05 < 0.2 * 0.5


def test_logit_bias_adds_to_the_logits_after_the_penalties():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    both = apply_penalties(logits, SamplingParams(repetition_penalty=2.0, logit_bias={1: 5.0, 3: -100}), [0], [])
    assert both.tolist() == [1.0, -1.0 + 5.0, 0.5, 3.0 - 100]  # the penalty first (2 / 2), then the bias
    assert SamplingParams(logit_bias={3: 1, 0: -1}).logit_bias == ((0, -1.0), (3, 1.0))  # hashable, sorted
    for bad in ({0: 101.0}, {-1: 1.0}):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_logit_bias_steers_greedy_and_sampled_rows_in_the_engine(llm):
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    banned = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                  logit_bias={t: -100 for t in set(free)}))[0].token_ids
    assert not set(banned) & set(free)  # none of the free run's tokens is chosen any more
    forced = llm.generate(["abc", "xyz"], SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True,
                                                         logit_bias={42: 100}))
    assert all(o.token_ids == [42] * 8 for o in forced)  # +100 dominates every draw, in a batch of two
    with pytest.raises(ValueError, match="logit_bias names token 211"):
        llm.generate(["abc"], SamplingParams(logit_bias={211: 1.0}))  # checked when added, not mid-step


def test_greedy_with_repetition_penalty_avoids_the_repeat():
    logits = torch.tensor([[0.0, 5.0, 4.0]])
    tok, _ = sample_batch(logits, [SampleRow(SamplingParams(temperature=0, repetition_penalty=3.0), None, [], [1])])
    assert tok == [2]


def test_mixed_batch_greedy_rows_equal_greedy_alone(llm):
    prompts = ["hello there", "a", "the quick brown fox"]
    greedy = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    alone = [o.token_ids for o in llm.generate(prompts, greedy)]
    mixed = llm.generate(prompts, [greedy, SamplingParams(temperature=1.5, top_k=3, seed=0, max_tokens=15), greedy])
    assert mixed[0].token_ids == alone[0] and mixed[2].token_ids == alone[2]


def test_stop_strings_cut_the_text_and_stop(llm):
    free = llm.generate(["xyz"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    stop = free.text[5:7]  # a string that the unconstrained run produces after 5 characters
    first = free.text.find(stop)
    out = llm.generate(["xyz"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.text == free.text[:first]
    assert stop not in out.text and len(out.token_ids) == first + len(stop)


def test_stop_token_ids_eos_and_ignore_eos(llm):
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    target = free.token_ids[7]
    out = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[target]))[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: free.token_ids.index(target)]
    assert llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=3))[0].finish_reason in ("length", "stop")


def test_min_tokens_holds_off_stop_token_ids_eos_and_stop_strings(llm):
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    target = free.token_ids[2]  # a token the free output writes early: it would end the output there
    first = free.token_ids.index(target)
    held = SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[target], min_tokens=first + 4)
    out = llm.generate(["abc"], held)[0]
    assert len(out.token_ids) >= first + 4 and target not in out.token_ids[:first + 4], out.token_ids
    # EOS is held off as stop_token_ids are: the model's own EOS made the only token it may write first
    eos = llm.tokenizer.eos_token_id
    forced_eos = SamplingParams(temperature=0, max_tokens=12, logit_bias={eos: 100.0}, min_tokens=5)
    out = llm.generate(["abc"], forced_eos)[0]
    assert len(out.token_ids) >= 5 and eos not in out.token_ids[:5] and out.finish_reason == "stop"
    stop = free.text[1:3]  # a stop string found in the first tokens' text is not honoured before min_tokens
    out = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop],
                                               min_tokens=len(free.token_ids)))[0]
    assert out.token_ids == free.token_ids
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_logprobs_are_log_softmax_of_the_model(llm):
    out = llm.generate(["some prompt"], SamplingParams(temperature=0, max_tokens=4, logprobs=5, ignore_eos=True))[0]
    model = llm.engine.model
    ids = torch.tensor([out.prompt_token_ids + out.token_ids])
    with torch.no_grad():
        lp = model(ids)[0][0].log_softmax(-1)
    n = len(out.prompt_token_ids)
    for i, (tok, info) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(info["logprob"] - float(lp[n - 1 + i, tok])) < 1e-4
        assert len(info["top"]) == 5 and max(info["top"].values()) == pytest.approx(info["logprob"], abs=1e-5)
    assert llm.generate(["x"], SamplingParams(max_tokens=2))[0].logprobs is None


def test_request_output_has_timing_in_order(llm):
    out = llm.generate(["timing"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    m = out.metrics
    assert m.arrival <= m.scheduled <= m.first_token <= m.last_token <= m.finished
    assert m.ttft_s >= 0 and m.decode_s >= 0


@pytest.mark.parametrize("kwargs, msg", [({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0}, "repetition"),
                                         ({"presence_penalty": 3}, "presence"), ({"logprobs": -1}, "logprobs"),
                                         ({"stop": [""]}, "stop")])
def test_new_invalid_params_are_refused(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)
