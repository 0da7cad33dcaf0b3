"""Llama-family checkpoints (Llama with GQA, Qwen2 with QKV bias) load by name and equal `transformers`."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tinystack.model import Llama, ModelFormatError, load_model

transformers = pytest.importorskip("transformers")


def _save(tmp_path, kind, **over):
    torch.manual_seed(0)
    kw = {**dict(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=40), **over}
    if kind == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    elif kind == "qwen3":  # per-head q/k norms; random gains so that they matter
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{"head_dim": 16, **kw}))
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    else:
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.self_attn.k_proj.bias.normal_()
    if over.get("attention_bias"):  # zero at init: make every projection's bias matter (o_proj's too)
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith("proj.bias"):
                    p.normal_()
    hf.eval().save_pretrained(tmp_path, safe_serialization=True)
    return hf


@pytest.mark.parametrize("kind, over", [("llama", {}), ("llama", {"tie_word_embeddings": True, "rope_theta": 500.0}),
                                        ("qwen2", {"tie_word_embeddings": True}),
                                        ("qwen3", {"tie_word_embeddings": True}), ("llama", {"attention_bias": True}),
                                        ("qwen3", {"attention_bias": True})])
def test_logits_equal_transformers(tmp_path, kind, over):
    hf = _save(tmp_path, kind, **over)
    ours = load_model(tmp_path)
    assert isinstance(ours, Llama) and ours.config.n_kv_head == 2
    assert ours.config.attention_bias == (kind == "qwen2" or over.get("attention_bias", False))
    assert ours.config.qk_norm == (kind == "qwen3")
    idx = torch.randint(0, 67, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(idx).logits, atol=1e-4)


# Llama 3.1 / 3.2's scaling with a short original context (64), so that head_dim 8's four frequencies fall in
# all three of its bands at theta 1e4: wavelengths 6.3 (kept), 63 (interpolated), 628 and 6283 (divided by 8)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling", [LLAMA3, {"rope_type": "linear", "factor": 4.0}], ids=["llama3", "linear"])
def test_scaled_rope_equals_transformers(tmp_path, scaling):
    from tinystack.model import save_model
    from tinystack.model.llama import rope_inv_freq

    hf = _save(tmp_path / "hf", "llama", rope_scaling={**scaling}, max_position_embeddings=512)  # (it adds keys)
    ours = load_model(tmp_path / "hf")
    assert ours.config.rope_scaling == scaling
    changed = rope_inv_freq(8, 10_000.0, scaling) / rope_inv_freq(8, 10_000.0)  # which frequencies moved, how far
    expect = [1.0, None, 0.125, 0.125] if scaling is LLAMA3 else [0.25] * 4
    for got, want in zip(changed.tolist(), expect):
        assert (0.125 < got < 1.0) if want is None else got == pytest.approx(want)
    idx = torch.randint(0, 67, (2, 300), generator=torch.Generator().manual_seed(3))  # past the original 64
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(idx).logits, atol=1e-4)
    save_model(ours, tmp_path / "ours", eos_token_id=3)  # written back as transformers reads it
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert torch.allclose(back(idx).logits, hf(idx).logits, atol=1e-4)


def test_clear_errors(tmp_path):
    _save(tmp_path, "llama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "layers.1.mlp.up_proj" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(ModelFormatError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        load_model(tmp_path)
    harmless = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}  # an older file's RoPE buffer
    save_file({**weights, **harmless}, tmp_path / "model.safetensors")
    load_model(tmp_path)
    norm = {"model.layers.0.self_attn.q_norm.weight": torch.ones(8)}  # a weight this model_type has no use for
    save_file({**weights, **norm}, tmp_path / "model.safetensors")
    with pytest.raises(ModelFormatError, match=r"llama model has no place for: \['model.layers.0.self_attn.q_norm"):
        load_model(tmp_path)
    save_file(weights, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(ModelFormatError, match="unsupported model_type 'mamba'.*'llama', 'qwen2'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}}))
    with pytest.raises(ModelFormatError, match="unsupported rope scaling 'yarn'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(ModelFormatError, match="rope scaling 'llama3' lacks 'low_freq_factor', 'high_freq_factor'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "hidden_size"}))
    with pytest.raises(ModelFormatError, match="lacks 'hidden_size'"):
        load_model(tmp_path)


@pytest.mark.parametrize("kind, over", [("llama", {}), ("qwen2", {"tie_word_embeddings": True}),
                                        ("qwen3", {"tie_word_embeddings": True})])
def test_saved_llama_is_a_hugging_face_checkpoint(tmp_path, kind, over):
    from tinystack.model import save_model

    _save(tmp_path / "hf", kind, **over)
    ours = load_model(tmp_path / "hf")
    save_model(ours, tmp_path / "ours", eos_token_id=3)  # what fine-tuning writes
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "qwen3": transformers.Qwen3ForCausalLM}[kind]
    back = cls.from_pretrained(tmp_path / "ours").eval()
    assert back.config.eos_token_id == 3
    idx = torch.randint(0, 67, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(back(idx).logits, ours(idx)[0], atol=1e-4)
        assert torch.equal(load_model(tmp_path / "ours")(idx)[0], ours(idx)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen3_trains_as_transformers_does(tmp_path, dtype):
    """Fused projections (as fine-tuning builds the model) and bf16 autocast: the loss and the q/k norms'
    gradients equal transformers' (bf16: within its rounding)."""
    hf = _save(tmp_path, "qwen3", tie_word_embeddings=True).train()
    ours = load_model(tmp_path).train()
    ours.fuse_projections()
    idx = torch.randint(0, 67, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        theirs = torch.nn.functional.cross_entropy(hf(idx).logits[:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())
        mine = torch.nn.functional.cross_entropy(ours(idx)[0][:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())
    theirs.backward()
    mine.backward()
    tol = 1e-5 if dtype == torch.float32 else 5e-2  # bf16: ~2e-2 seen here; CPUs round bf16 products differently
    assert abs(mine.item() - theirs.item()) < tol
    for i in range(2):
        for n in ("q_norm", "k_norm"):
            g_hf = getattr(hf.model.layers[i].self_attn, n).weight.grad
            g = getattr(ours.model.layers[i].self_attn, n).weight.grad
            assert g is not None and g.abs().sum() > 0
            torch.testing.assert_close(g, g_hf, atol=tol * max(1.0, g_hf.abs().max().item()), rtol=tol)
