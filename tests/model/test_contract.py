"""Every model family keeps the model contract (model/contract.py): each member present and doing what it says —
shapes, the loss, positions, logit_index, apply_head, a KV cache's attend, tying, fusing, rotary tables."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tinystack.model import GPT, GPTConfig, Llama, LlamaConfig
from tinystack.model.contract import FusesProjections, HasRopeTables, LanguageModel, ModelConfig

VOCAB = 97
LLAMA = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, n_layer=2, n_head=4, n_kv_head=2,
             max_position_embeddings=40)
FAMILIES = {
    "gpt": lambda: GPT(GPTConfig(vocab_size=VOCAB, block_size=40, n_layer=2, n_head=4, n_embd=48)),
    "llama": lambda: Llama(LlamaConfig(**LLAMA)),
    "llama_tied": lambda: Llama(LlamaConfig(**LLAMA, tie_word_embeddings=True)),
    "mistral": lambda: Llama(LlamaConfig(**LLAMA, model_type="mistral")),
    "qwen2": lambda: Llama(LlamaConfig(**LLAMA, model_type="qwen2", attention_bias=True, tie_word_embeddings=True)),
    "qwen3": lambda: Llama(LlamaConfig(**LLAMA, model_type="qwen3", qk_norm=True, head_dim=16)),
}


@pytest.fixture(params=sorted(FAMILIES))
def model(request) -> nn.Module:
    torch.manual_seed(0)
    m = FAMILIES[request.param]().eval()
    with torch.no_grad():  # biases and norm gains away from their zero / one init, so a dropped one shows
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m


def _ids(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _embedding(model: nn.Module) -> nn.Embedding:
    return next(m for m in model.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == VOCAB)


class ListCache:
    """The simplest KVCache: per layer, keys and values concatenated along time; every query attends over the
    whole history plus the causal part of its own step. Records the shapes it was called with."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.calls: list[tuple[int, tuple, tuple]] = []

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.calls.append((layer, tuple(q.shape), tuple(k.shape)))
        if layer in self.k:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        t, s = q.shape[2], k.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def test_the_members_are_there_and_the_config_names_the_shapes(model):
    cfg = model.config
    assert isinstance(model, LanguageModel) and isinstance(cfg, ModelConfig)
    assert cfg.n_head % cfg.n_kv_head == 0 and cfg.max_seq_len == 40 and cfg.vocab_size == VOCAB
    assert json.loads(json.dumps(cfg.to_dict())) == cfg.to_dict()
    assert model.lm_head.weight.shape[0] == VOCAB
    assert model.num_params() == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    cache = ListCache()
    with torch.no_grad():
        model(_ids(2, 5), kv_cache=cache, positions=torch.arange(5).expand(2, 5))
    assert [c[0] for c in cache.calls] == list(range(cfg.n_layer))  # every layer goes through the cache
    assert {c[1] for c in cache.calls} == {(2, cfg.n_head, 5, cfg.head_dim)}
    assert {c[2] for c in cache.calls} == {(2, cfg.n_kv_head, 5, cfg.head_dim)}


@torch.no_grad()
def test_forward_keywords_mean_what_the_contract_says(model):
    idx = _ids(2, 9)
    logits, loss = model(idx)
    assert logits.shape == (2, 9, VOCAB) and loss is None
    targets = _ids(2, 9, seed=2)
    targets[0, :3] = -100
    _, loss = model(idx, targets=targets)
    assert torch.allclose(loss, F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1),
                                                ignore_index=-100), atol=1e-6)
    positions = torch.arange(9).expand(2, 9)
    assert torch.allclose(model(idx, positions=positions)[0], logits, atol=1e-6)
    last = model(idx, logit_index=torch.tensor([8, 4]))[0]
    assert last.shape == (2, 1, VOCAB)
    assert torch.allclose(last[:, 0], logits[torch.arange(2), torch.tensor([8, 4])], atol=1e-5)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 2], mask[1, 5], mask[1, 7] = True, True, True
    picked = model(idx, logit_index=mask)[0]
    assert picked.shape == (3, 1, VOCAB) and torch.allclose(picked[:, 0], logits[mask], atol=1e-5)
    h, none = model(idx, logit_index=mask, apply_head=False)
    assert none is None and h.shape == (3, 1, model.lm_head.weight.shape[1])
    assert torch.allclose(model.lm_head(h), picked, atol=1e-5)
    with pytest.raises(ValueError):
        model(_ids(1, model.config.max_seq_len + 1))


@torch.no_grad()
def test_a_kv_cache_step_gives_the_full_forwards_logits(model):
    idx = _ids(2, 10)
    full = model(idx)[0]
    cache = ListCache()
    first = model(idx[:, :7], kv_cache=cache, positions=torch.arange(7).expand(2, 7))[0]
    rest = model(idx[:, 7:], kv_cache=cache, positions=torch.arange(7, 10).expand(2, 3))[0]
    assert torch.allclose(torch.cat([first, rest], dim=1), full, atol=1e-5)


def test_tie_weights_ties_exactly_the_tied_families(model):
    emb = _embedding(model)
    tied = model.lm_head.weight is emb.weight
    emb.weight = nn.Parameter(emb.weight.detach().clone())  # as a loader replaces parameters
    model.tie_weights()
    assert (model.lm_head.weight is emb.weight) == tied
    assert tied == getattr(model.config, "tie_word_embeddings", True)  # GPT-2 is always tied


@torch.no_grad()
def test_optional_members_keep_their_promises(model):
    idx = _ids(2, 6)
    if isinstance(model, FusesProjections):
        before, keys = model(idx)[0], set(model.state_dict())
        fused = copy.deepcopy(model)
        fused.fuse_projections()
        fused.fuse_projections()  # idempotent
        assert set(fused.state_dict()) == keys and torch.allclose(fused(idx)[0], before, atol=1e-5)
    if isinstance(model, HasRopeTables):
        cos, sin = model.rope_tables(torch.device("cpu"))
        assert cos.shape == sin.shape == (model.config.max_seq_len, model.config.head_dim)
        assert cos.dtype == sin.dtype == torch.float32
        assert torch.allclose(cos[0], torch.ones(model.config.head_dim)) and not sin[0].any()  # position 0: none
        assert torch.allclose(cos ** 2 + sin ** 2, torch.ones_like(cos), atol=1e-5)  # a rotation at each position
    assert isinstance(model, FusesProjections) == isinstance(model, HasRopeTables) == isinstance(model, Llama)
