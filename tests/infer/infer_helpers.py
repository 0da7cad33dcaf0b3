"""Helpers for the inference tests: tiny random-weight models of each family, built with `transformers`
here (no downloads), a toy tokenizer and random prompts. (A uniquely named module, not conftest:
every test folder has a conftest.py, and `from conftest import ...` would pick up whichever came first.)"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 211


class ToyTokenizer:
    """Characters <-> ids (id = 3 + code point % (VOCAB - 3)); id 0 is EOS. Enough for the engine's text paths."""

    eos_token_id = 0
    eos_token_ids = frozenset({0})

    def encode_ordinary(self, text: str) -> list[int]:
        return [3 + ord(c) % (VOCAB - 3) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(97 + (i - 3) % 26) if i >= 3 else "" for i in ids)


def _hf_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_positions=160, n_embd=48, n_layer=2, n_head=4, **common)
        return transformers.GPT2LMHeadModel(cfg).eval()
    if kind == "llama":
        cfg = transformers.LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=160, **common)
        return transformers.LlamaForCausalLM(cfg).eval()
    if kind == "qwen3":  # per-head q/k norms (random gains, so they matter), head_dim given apart from hidden
        cfg = transformers.Qwen3Config(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, max_position_embeddings=160,
                                       tie_word_embeddings=True, **common)
        model = transformers.Qwen3ForCausalLM(cfg).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
        return model
    cfg = transformers.Qwen2Config(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=160, tie_word_embeddings=True,
                                   **common)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random init zeroes biases; make the QKV biases matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def random_prompts(lengths, seed=0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
