"""The fused decode step (infer/fused_decode.py, quant/decode_step.cpp) against the model's own forward over the
BatchView: same logits and the same keys/values written, for every weight format, GQA, QKV biases, scattered
paged blocks and mixed contexts; and greedy generation that takes it gives the tokens of the unfused engine."""
from __future__ import annotations

import copy

import pytest
import torch
from infer_helpers import VOCAB, ToyTokenizer, random_prompts

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.model_runner import ModelRunner
from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import FORMATS
from tinystack.infer.quant.linear import quantize_model
from tinystack.infer.sampler import SamplingParams as Params
from tinystack.infer.sequence import Sequence
from tinystack.model.llama import Llama, LlamaConfig

pytestmark = pytest.mark.skipif(kernels.extension() is None, reason="needs the C++ extension (a C++ compiler)")


def _llama(bias: bool, fmt: str, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, n_layer=3, n_head=6, n_kv_head=2,
                      head_dim=16, max_position_embeddings=256, attention_bias=bias, mlp_bias=bias)
    model = Llama(cfg).eval()
    with torch.no_grad():  # random init zeroes biases and sets norm gains to 1; make both matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    if fmt != "float32":
        quantize_model(model, fmt)
    return model


def _runner(model: Llama, fused: bool, bs: int = 4, n_blocks: int = 96) -> ModelRunner:
    storage = KVStorage(3, n_blocks, bs, 2, 16, hugepages=False)
    return ModelRunner(copy.deepcopy(model), storage, hugepages=False, fused_decode=fused)


def _sequences(starts: list[int], bs: int, seed: int) -> list[Sequence]:
    """Sequences with `starts` tokens computed and one more to feed, on scattered (non-consecutive) blocks."""
    order = torch.randperm(95, generator=torch.Generator().manual_seed(seed)).add(1).tolist()
    seqs, at = [], 0
    for i, (s, ids) in enumerate(zip(starts, random_prompts([s + 1 for s in starts], seed=seed))):
        seq = Sequence(str(i), "", ids, Params(max_tokens=1), max_new_tokens=1)
        k = -(-(s + 1) // bs)
        seq.block_table, at = order[at:at + k], at + k
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("fmt", ["float32", *FORMATS])
@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_fused_step_equals_the_model_forward(fmt, bias):
    model = _llama(bias, fmt)
    fused, ref = _runner(model, True), _runner(model, False)
    assert fused.fused is not None and ref.fused is None
    starts = [0, 9, 30, 3, 17]
    seqs = _sequences(starts, 4, seed=1)
    for runner in (fused, ref):  # the histories: prefill through the model's forward in both
        runner.run([(seq, s) for seq, s in zip(seqs, starts) if s > 0])
    for seq, s in zip(seqs, starts):
        seq.num_computed = s
    assert fused.fused.accepts([(seq, 1) for seq in seqs])
    for rows in (seqs, seqs[2:3]):  # a batch of decodes, and batch 1
        got, want = fused.run([(seq, 1) for seq in rows]), ref.run([(seq, 1) for seq in rows])
        assert got.shape == want.shape == (len(rows), VOCAB)
        tol = 1e-4 if fmt in ("float32", "bf16") else 2e-3  # the quantised kernels round activations to int8
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(fused.storage.k, ref.storage.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused.storage.v, ref.storage.v, rtol=1e-4, atol=1e-4)


def test_fused_step_declines_what_it_does_not_run():
    model = _llama(False, "float32")
    runner = _runner(model, True)
    seqs = _sequences([3, 5], 4, seed=2)
    assert not runner.fused.accepts([(seqs[0], 2), (seqs[1], 1)])  # a prefill chunk beside a decode
    assert not runner.fused.accepts([(seqs[0], 1)] * kernels.GEMM_MIN_ROWS)  # the float GEMM's territory
    bf16_cache = ModelRunner(copy.deepcopy(model), KVStorage(3, 8, 4, 2, 16, dtype=torch.bfloat16, hugepages=False),
                             hugepages=False)
    assert bf16_cache.fused is None


@pytest.mark.parametrize("fmt", ["float32", "q4_1"])
def test_greedy_generation_with_and_without_the_fused_step(fmt):
    model = _llama(True, fmt, seed=3)
    prompts = random_prompts([3, 17, 1, 40, 9, 25], seed=7)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def generate(fused: bool):
        llm = LLM(copy.deepcopy(model), ToyTokenizer(), memory_limit=2**30, max_num_seqs=6, block_size=4,
                  verbose=False)
        assert llm.engine.runner.fused is not None
        if not fused:
            llm.engine.runner.fused = None  # every step through the model's forward
        return [o.token_ids for o in llm.generate(prompts, params)]

    assert generate(True) == generate(False)
