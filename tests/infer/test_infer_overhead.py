"""Less work per decode step, same answers: fused projections (model/fused_linear.py) and batched decode
attention (paged_cache.BatchView), each held against the unfused / per-sequence path it replaces."""
from __future__ import annotations

import copy

import pytest
import torch
from infer_helpers import VOCAB, ToyTokenizer, random_prompts

from tinystack.infer import LLM, SamplingParams
from tinystack.infer.paged_cache import BatchView, KVStorage
from tinystack.infer.quant.formats import FORMATS
from tinystack.infer.quant.linear import quantize_model
from tinystack.model.llama import Llama, LlamaConfig


def _llama(bias: bool = False, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, n_layer=3, n_head=4, n_kv_head=2,
                      max_position_embeddings=256, attention_bias=bias)
    model = Llama(cfg).eval()
    with torch.no_grad():  # random init zeroes biases; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_fused_projections_give_the_unfused_logits_and_state_dict(bias):
    model = _llama(bias)
    idx = torch.randint(0, VOCAB, (2, 37), generator=torch.Generator().manual_seed(1))
    ref = model(idx)[0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fused = copy.deepcopy(model)
    fused.fuse_projections()
    fused.fuse_projections()  # idempotent
    attn, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert attn.fused and mlp.fused and not hasattr(attn, "q_proj") and not hasattr(mlp, "up_proj")
    assert attn.qkv_proj.out_features == (4 + 2 * 2) * 16 and mlp.gate_up_proj.out_features == 2 * 96
    torch.testing.assert_close(fused(idx)[0], ref, rtol=1e-5, atol=1e-5)
    saved = fused.state_dict()  # Hugging Face's names and tensors, as before fusing
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in state)
    fresh = copy.deepcopy(model)
    fresh.fuse_projections()
    fresh.load_state_dict({k: v * 2 for k, v in state.items()})  # loading by those names fills the fused tensors
    model.load_state_dict({k: v * 2 for k, v in state.items()})
    torch.testing.assert_close(fresh(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_fusing_quantised_layers_stacks_their_packed_rows(fmt):
    """QuantLinear.concat re-quantises nothing: the fused layer's output is exactly the separate layers'."""
    model = _llama(bias=True)
    quantize_model(model, fmt)
    idx = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    ref = model(idx)[0]
    model.fuse_projections()
    assert type(model.model.layers[1].self_attn.qkv_proj).__name__ == "QuantLinear"
    assert torch.equal(model(idx)[0], ref)


def _random_storage(n_blocks: int, bs: int, seed: int = 0) -> KVStorage:
    st = KVStorage(2, n_blocks, bs, 2, 16, hugepages=False)
    g = torch.Generator().manual_seed(seed)
    st.k.copy_(torch.randn(st.k.shape, generator=g))
    st.v.copy_(torch.randn(st.v.shape, generator=g))
    return st


@pytest.mark.parametrize("bs,starts,lengths", [
    (4, [30, 0, 7, 12, 3, 19], [1, 1, 1, 9, 1, 1]),  # decodes at mixed contexts around a prefill chunk
    (4, [5, 40, 2, 17], [1, 1, 1, 1]),  # decodes only
    (64, [5, 40, 0], [1, 1, 1]),  # contiguous-style: one large block per sequence
])
@torch.no_grad()
def test_batched_decode_attention_equals_the_per_sequence_path(bs, starts, lengths):
    n_blocks = 64
    st_batched, st_rows = _random_storage(n_blocks, bs), _random_storage(n_blocks, bs)
    need = [-(-(s + n) // bs) for s, n in zip(starts, lengths)]
    order = torch.randperm(n_blocks - 1, generator=torch.Generator().manual_seed(3)).add(1).tolist()
    tables, at = [], 0
    for k in need:  # scattered, non-consecutive blocks
        tables.append(order[at:at + k])
        at += k
    N = sum(lengths)
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 4, N, 16, generator=g), torch.randn(1, 2, N, 16, generator=g), torch.randn(1, 2, N, 16)
    cpu = torch.device("cpu")
    batched = BatchView(st_batched, tables, starts, lengths, cpu)
    rows = BatchView(st_rows, tables, starts, lengths, cpu, batch_decodes=False)
    assert len(batched.decodes) == lengths.count(1) and not rows.decodes
    for layer in range(2):
        torch.testing.assert_close(batched.attend(layer, q, k, v), rows.attend(layer, q, k, v), rtol=1e-5, atol=1e-5)
    assert torch.equal(st_batched.k, st_rows.k) and torch.equal(st_batched.v, st_rows.v)


def test_greedy_batch_equals_one_at_a_time():
    """16 prompts of mixed lengths through continuous batching (decodes batched, prefills chunked beside them)
    give each prompt the tokens it gets alone."""
    model = _llama(bias=True, seed=5)
    prompts = random_prompts([3, 17, 1, 40, 9, 25, 6, 33, 2, 12, 50, 8, 19, 4, 28, 11], seed=7)
    params = [SamplingParams(temperature=0, max_tokens=8 + i % 5 * 6, ignore_eos=True) for i in range(len(prompts))]

    def llm():
        return LLM(model, ToyTokenizer(), memory_limit_mb=1024, max_num_seqs=16, max_num_batched_tokens=64,
                   kv_block_size=4)

    together = llm().generate(prompts, params)
    alone = llm()
    for p, sp, out in zip(prompts, params, together):
        assert out.token_ids == alone.generate([p], sp)[0].token_ids
