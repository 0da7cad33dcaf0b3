"""Speculative decoding (infer/speculative.py, infer/draft_model.py): greedy output identical to plain decoding,
the KV cache rolled back past rejected drafts, and sampled output distributed as the target's (chi-square)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from infer_helpers import ToyTokenizer, random_prompts
from scipy.stats import chi2

from tinystack.config import InferConfig
from tinystack.infer import LLM, LLMEngine, SamplingParams
from tinystack.infer.speculative import Draft, lookup
from tinystack.model import GPT, GPTConfig
from tinystack.model.llama import Llama, LlamaConfig


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: on shared cores a second torch thread only waits for the other processes (eval/threads.py)."""
    from tinystack.eval.threads import torch_threads

    with torch_threads(1):
        yield


def _gpt(seed: int, n_layer: int = 2, vocab: int = 211) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, block_size=128, n_layer=n_layer, n_head=2, n_embd=16)).eval()


def _llama(seed: int, n_layer: int = 2) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(vocab_size=211, hidden_size=32, intermediate_size=48, n_layer=n_layer, n_head=4,
                             n_kv_head=2, max_position_embeddings=128)).eval()


def _llm(model, **kw) -> LLM:
    return LLM(model, ToyTokenizer(), **{"memory_limit_mb": 1024, "kv_block_size": 4, **kw})


GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
# a prompt-lookup-friendly prompt (it repeats itself), random ones, a short one: different lengths in one batch
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], *random_prompts([3, 17, 30, 9], seed=1), [20]]


def test_lookup_takes_the_latest_longest_ngram_match():
    assert lookup([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], k=2, min_n=1, max_n=3) == [5, 1]  # latest "1 2 3" wins
    assert lookup([1, 2, 9, 7, 2, 8, 1, 2], k=3, min_n=1, max_n=2) == [9, 7, 2]  # "1 2" before "2"
    assert lookup([4, 2, 9, 7, 3, 2], k=3, min_n=1, max_n=2) == [9, 7, 3]  # falls back to n = 1
    assert lookup([1, 2, 3, 4], k=3, min_n=1, max_n=3) == []  # nothing repeats
    assert lookup([7, 7], k=4, min_n=1, max_n=3) == [7]  # never past the end


@pytest.mark.parametrize("family", [_gpt, _llama])
@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
@pytest.mark.parametrize("kv", [dict(), dict(kv_cache="contiguous"), dict(num_kv_blocks=40, max_num_seqs=4),
                                dict(scheduler="dynamic", max_num_seqs=3)],
                         ids=["paged", "contiguous", "preempting", "dynamic"])
def test_greedy_output_is_plain_greedy_token_for_token(family, mode, kv):
    """Several sequences in one batch, each with its own drafts; a different random draft model is often wrong,
    so both acceptance and rejection happen; a small cache (num_kv_blocks=40) also preempts; the dynamic batcher
    runs batches to completion."""
    target = family(0)
    plain = _llm(target, **kv).generate(PROMPTS, GREEDY)
    extra = {"draft": family(1, n_layer=1)} if mode == "draft" else {}
    llm = _llm(target, speculative=mode, num_speculative_tokens=3, **extra, **kv)
    outs = llm.generate(PROMPTS, GREEDY)
    for p, o in zip(plain, outs):
        assert o.token_ids == p.token_ids
    e = llm.engine
    assert 0 < e.spec_accepted_tokens < e.spec_proposed_tokens  # both outcomes were exercised
    assert sum(o.metrics.spec_proposed for o in outs) == e.spec_proposed_tokens
    assert sum(o.metrics.spec_accepted for o in outs) == e.spec_accepted_tokens
    e.block_manager.check()
    assert e.num_used_blocks == 0  # every block (the drafts' ones too) came back
    if "num_kv_blocks" in kv:
        assert e.num_preemptions > 0


def test_stop_strings_eos_and_logprobs_apply_per_accepted_token():
    """A stop string met inside an accepted run of drafts ends the output there; logprobs are the target's."""
    target = _gpt(0)
    plain = _llm(target).generate(PROMPTS, GREEDY)
    text = plain[0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    params = SamplingParams(temperature=0, max_tokens=40, stop=[stop], logprobs=2)
    want = _llm(target).generate(PROMPTS, params)
    spec = _llm(target, speculative="prompt_lookup", num_speculative_tokens=4)
    got = spec.generate(PROMPTS, params)
    assert spec.engine.spec_accepted_tokens > 0
    assert want[0].finish_reason == "stop" and want[0].text == text[:text.index(stop)]
    for w, g in zip(want, got):
        assert (g.text, g.token_ids, g.finish_reason) == (w.text, w.token_ids, w.finish_reason)
        for a, b in zip(g.logprobs, w.logprobs):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4) and a["top"].keys() == b["top"].keys()
    eos = plain[0].token_ids[5]  # a token the greedy run makes: as a stop token it ends the output before it
    cut = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[eos])
    want = _llm(target).generate(PROMPTS, cut)
    got = _llm(target, speculative="prompt_lookup", num_speculative_tokens=4).generate(PROMPTS, cut)
    assert [g.token_ids for g in got] == [w.token_ids for w in want] and len(want[0].token_ids) <= 5


def test_draft_model_proposals_are_its_own_greedy_continuation_through_its_rolled_back_cache():
    """What the draft proposes each step equals the draft model's greedy continuation computed from scratch
    (no cache): its own cache stays right across accepted and rejected drafts, preemption-free batching."""
    target, draft_model = _gpt(0), _gpt(1, n_layer=1)
    llm = _llm(target, speculative="draft", draft=draft_model, num_speculative_tokens=3)
    proposer = llm.engine.speculator.proposer
    seen = []

    def checked(rows):
        drafts = type(proposer).propose(proposer, rows)
        seen.extend((list(seq.token_ids), d.tokens) for (seq, _), d in zip(rows, drafts))
        return drafts

    proposer.propose = checked
    llm.generate(PROMPTS, GREEDY)
    assert len(seen) > 20
    with torch.no_grad():
        for ids, proposed in seen:
            ids = list(ids)
            for tok in proposed:
                logits, _ = draft_model(torch.tensor([ids]))
                assert tok == int(logits[0, -1].argmax())
                ids.append(tok)


class SecondWrong:
    """Proposes the true greedy continuation with its second token wrong: exactly one draft is accepted a step."""

    def __init__(self, truth: list[int], k: int):
        self.truth, self.k = truth, k

    def propose(self, rows):
        out = []
        for seq, limit in rows:
            nxt = self.truth[seq.num_tokens: seq.num_tokens + min(self.k, limit)]
            out.append(Draft(nxt[:1] + [(t + 1) % 211 for t in nxt[1:2]] + nxt[2:]))
        return out


def test_rejected_drafts_are_rolled_back_in_the_paged_cache():
    """Per step: one accepted, the rest rejected. After every step the sequence holds exactly the blocks of its
    computed tokens, the cache holds the same keys/values a plain engine computes for them, and the prefix cache
    registered only true tokens (a later request reusing them continues exactly like plain decoding)."""
    target, prompt = _gpt(0), random_prompts([6], seed=3)[0]
    truth = prompt + _llm(target).generate([prompt], GREEDY)[0].token_ids
    engine = LLMEngine(target, ToyTokenizer(), InferConfig(memory_limit_mb=1024, kv_block_size=4,
                                                           speculative="prompt_lookup", num_speculative_tokens=4))
    engine.speculator.proposer = SecondWrong(truth, 4)
    seq = engine.add_request(None, prompt, GREEDY)
    bs = engine.block_manager.block_size
    while engine.has_unfinished():
        before = engine.spec_accepted_tokens
        engine.step()
        if seq.is_finished:
            break
        assert seq.token_ids == truth[:seq.num_tokens]
        if engine.spec_proposed_tokens:
            assert engine.spec_accepted_tokens - before in (0, 1)
        assert seq.num_computed == seq.num_tokens - 1
        assert len(seq.block_table) == -(-seq.num_computed // bs)
        engine.block_manager.check()
    assert engine.spec_accepted_tokens > 0 and engine.spec_proposed_tokens > 2 * engine.spec_accepted_tokens
    # the keys/values a plain engine writes for the same tokens (max_tokens=2: still running after one step)
    ONE_STEP = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    plain = LLMEngine(target, ToyTokenizer(), InferConfig(memory_limit_mb=1024, kv_block_size=4))
    ref = plain.add_request(None, truth[:-1], ONE_STEP)
    plain.step()
    n = len(truth) - 1
    slots = lambda s: torch.tensor([s.block_table[p // bs] * bs + p % bs for p in range(n)])  # noqa: E731
    # the finished sequence's full blocks stay in the prefix cache: a request for the same tokens reads them
    hit = engine.add_request(None, truth[:-1], ONE_STEP)
    engine.step()
    full = (n // bs) * bs  # full blocks came from the prefix cache the speculative run filled
    assert hit.num_cached_prompt_tokens == full > 0
    for store, ref_store in ((engine.storage.k, plain.storage.k), (engine.storage.v, plain.storage.v)):
        got = store.view(store.size(0), -1, *store.shape[3:])[:, slots(hit)]
        want = ref_store.view(ref_store.size(0), -1, *ref_store.shape[3:])[:, slots(ref)]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert hit.output_ids == ref.output_ids == truth[-1:]


# ---- sampling: the output is distributed as the target's ----------------------------------------------------------
V, PROMPT = 8, [1, 2, 3, 1, 2, 3, 1, 2]  # a tiny vocabulary; a prompt the n-gram proposer can match
SAMPLED = dict(temperature=0.9, top_k=6, max_tokens=3, ignore_eos=True)


def _peaked(seed: int) -> Llama:
    """A one-layer Llama whose next-token distributions spread over a few of the V tokens (untied head, scaled)."""
    torch.manual_seed(seed)
    model = Llama(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, n_layer=1, n_head=4, n_kv_head=2,
                              max_position_embeddings=64)).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.3)
    return model


def _exact_joint(model) -> torch.Tensor:
    """P(t1, t2, t3) [V, V, V] of the target under SAMPLED, by enumerating every prefix."""
    from tinystack.infer.sampler import sampling_probs

    params = SamplingParams(**SAMPLED)
    joint = torch.ones(())
    prefixes = torch.tensor([PROMPT])
    for _ in range(3):
        with torch.no_grad():
            logits, _ = model(prefixes)
        p = sampling_probs(logits[:, -1], params).double()  # [prefixes, V]
        joint = (joint.reshape(-1, 1) * p).reshape(-1)
        prefixes = torch.cat([prefixes.repeat_interleave(V, 0), torch.arange(V).repeat(len(prefixes))[:, None]], 1)
    return joint.reshape(V, V, V)


def _p_value(samples: list[list[int]], joint: torch.Tensor) -> float:
    """Chi-square goodness of fit over (t1, t2, t3) cells; cells expecting < 5 draws are pooled into one."""
    counts = torch.zeros(V ** 3, dtype=torch.float64)
    for t in samples:
        counts[t[0] * V * V + t[1] * V + t[2]] += 1
    expected = joint.reshape(-1) * len(samples)
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def _sample(mode: str, n: int = 2000) -> tuple[list[list[int]], LLM]:
    extra = {"draft": _peaked(7)} if mode == "draft" else {}
    llm = _llm(_peaked(0), speculative=mode, num_speculative_tokens=2, max_num_seqs=128, **extra)
    outs = llm.generate([PROMPT] * n, [SamplingParams(**SAMPLED, seed=s) for s in range(n)])
    return [o.token_ids for o in outs], llm


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
def test_sampled_output_follows_the_target_distribution(mode):
    joint = _exact_joint(_peaked(0))
    samples, llm = _sample(mode)
    e = llm.engine
    assert 0 < e.spec_accepted_tokens < e.spec_proposed_tokens  # drafts were both accepted and rejected
    assert _p_value(samples, joint) > 1e-3


def test_the_distribution_check_catches_a_wrong_acceptance_rule(monkeypatch):
    """The same check fails when every draft is accepted (the output then follows the draft model, not the target)."""
    from tinystack.infer import speculative

    monkeypatch.setattr(speculative, "_rejection_sample",
                        lambda p, draft, gen: draft.tokens + [int(torch.multinomial(p[-1], 1, generator=gen))])
    samples, _ = _sample("draft")
    assert _p_value(samples, _exact_joint(_peaked(0))) < 1e-3


def test_config_errors_are_one_line():
    target = _gpt(0)
    with pytest.raises(ValueError, match="needs draft_model"):
        _llm(target, speculative="draft")
    with pytest.raises(ValueError, match="same tokenizer"):
        _llm(target, speculative="draft", draft=_gpt(1, vocab=100))
    with pytest.raises(ValueError, match="infer.speculative: expected one of .off., .prompt_lookup., .draft."):
        _llm(target, speculative="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        _llm(target, speculative="prompt_lookup", num_speculative_tokens=0)


def test_infer_config_turns_speculation_on():
    from tinystack.config import InferConfig

    cfg = InferConfig(speculative="prompt_lookup", num_speculative_tokens=2, prompt_lookup_max=2)
    engine = LLMEngine(_gpt(0), ToyTokenizer(), dataclasses.replace(cfg, memory_limit_mb=1024))
    assert engine.speculator.k == 2 and engine.speculator.proposer.max_n == 2
