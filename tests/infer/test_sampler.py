"""Sampling (`sample_batch`, the engine's one sampler): greedy is argmax, filters keep exactly the
allowed tokens, seeds reproduce."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tinystack.infer import SamplingParams, sample_batch, top_k_filter, top_p_filter
from tinystack.infer.sampler import SampleRow


def _logits(batch=4, vocab=50, seed=0):
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _sample(logits, params, gen=None):
    """One token per row of `logits`, every row with the same params and generator."""
    return sample_batch(logits, [SampleRow(params, gen, [], []) for _ in range(logits.size(0))])[0]


def test_greedy_is_argmax():
    logits = _logits()
    assert _sample(logits, SamplingParams(temperature=0.0)) == logits.argmax(-1).tolist()


def test_top_k_never_emits_outside_top_k():
    logits = _logits()
    allowed = torch.topk(logits, 5, dim=-1).indices
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        tok = torch.tensor(_sample(logits, SamplingParams(temperature=2.0, top_k=5), gen))
        assert (allowed == tok[:, None]).any(-1).all()


def test_top_p_never_emits_outside_nucleus():
    logits = _logits()
    p = 0.6
    probs = logits.softmax(-1)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        tok = _sample(logits, SamplingParams(temperature=1.0, top_p=p), gen)
        for row, t in enumerate(tok):
            # t is in the nucleus iff the mass of tokens strictly more likely than t is < p
            assert probs[row][probs[row] > probs[row, t]].sum() < p
            seen.add((row, t))
    assert len(seen) > 4  # it does sample, not just argmax


def test_filters_keep_exact_sets():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [[True, False, False, True]]
    probs = logits.softmax(-1)[0]  # ~[0.03, 0.64, 0.24, 0.09]
    kept = ~torch.isinf(top_p_filter(logits, float(probs[1]) + 0.01))
    assert kept.tolist() == [[False, True, True, False]]
    assert (~torch.isinf(top_p_filter(logits, 0.01))).sum() == 1  # the top token always survives


def test_fixed_seed_reproduces_and_differs_across_seeds():
    logits = _logits(batch=1, vocab=1000)
    params = SamplingParams(temperature=1.5)
    runs = [[_sample(logits, params, g)[0] for _ in range(20)]
            for g in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))]
    assert runs[0] == runs[1]
    other = [_sample(logits, params, g)[0] for g in [torch.Generator().manual_seed(8)] for _ in range(20)]
    assert other != runs[0]
    assert _sample(logits, params, torch.Generator().manual_seed(7)) == runs[0][:1]


def test_each_row_draws_from_its_own_generator():
    """A row's draws depend only on its own seed, not on what else is in the batch."""
    logits = _logits(batch=3, vocab=500)
    params = SamplingParams(temperature=1.2)
    alone = [sample_batch(logits[1:2], [SampleRow(params, torch.Generator().manual_seed(5), [], [])])[0][0]
             for _ in range(5)]
    mixed = []
    for _ in range(5):
        rows = [SampleRow(params, torch.Generator().manual_seed(99), [], []),
                SampleRow(params, torch.Generator().manual_seed(5), [], []),
                SampleRow(SamplingParams(temperature=0), None, [], [])]
        mixed.append(sample_batch(logits, rows)[0][1])
    assert mixed == alone


@pytest.mark.parametrize("kwargs, msg", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
    ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
])
def test_invalid_params_are_refused(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)


@settings(max_examples=60, deadline=None)
@given(temperature=st.one_of(st.just(5e-324), st.just(1e-300), st.floats(0, 2)),  # the allowed range
       top_p=st.one_of(st.just(1e-46), st.just(5e-324), st.floats(1e-300, 1.0)),
       top_k=st.integers(-1, 40), min_p=st.floats(0, 1), seed=st.integers(0, 2**31))
def test_any_valid_params_give_a_token_the_filters_allow(temperature, top_p, top_k, min_p, seed):
    """Extreme but valid values (a subnormal temperature, a top_p below float32's range) still sample a
    real token: greedy below 1e-5, and the top token always survives top-p."""
    if top_p <= 0:
        return
    logits = torch.randn(1, 37, generator=torch.Generator().manual_seed(seed)) * 4
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    tokens, _ = sample_batch(logits, [SampleRow(params, gen, [], [])])
    assert 0 <= tokens[0] < 37
    if temperature < 1e-5 or top_p < 1e-30:  # greedy, or a nucleus of just the top token
        assert tokens[0] == int(logits.argmax())
