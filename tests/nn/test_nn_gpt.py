"""The NumPy GPT: same names as the PyTorch GPT, gradients equal to autograd, model directories shared."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tinystack.model.gpt import GPTConfig
from tinystack.model.io import load_model
from tinystack.nn import numerical_grad, rel_error
from tinystack.nn.gpt import GPT
from tinystack.nn.gpt_io import from_torch, load_numpy_gpt, save_numpy_gpt, to_torch
from tinystack.nn.loss import IGNORE_INDEX

CFG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)


def _batch(seed: int = 0, B: int = 3, T: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, CFG.vocab_size, (B, T)), rng.integers(0, CFG.vocab_size, (B, T))


def test_parameter_names_equal_the_torch_gpt() -> None:
    torch_names = {n for n, _ in to_torch(GPT(CFG)).named_parameters()}
    assert {n for n, _ in GPT(CFG).named_parameters()} == torch_names


def test_all_gradients_match_torch_autograd_float64() -> None:
    model = GPT(CFG, dtype=np.float64, seed=3)
    idx, tgt = _batch()
    tgt[0, 2] = IGNORE_INDEX  # an ignored position, as torch's ignore_index=-100
    loss, grads = model.loss_and_grads(idx, tgt)

    tm = to_torch(model)
    logits, _ = tm(torch.from_numpy(idx))
    # the loss is computed here in float64 (GPT.forward's own loss casts logits to float32)
    ref = F.cross_entropy(logits.view(-1, CFG.vocab_size), torch.from_numpy(tgt).view(-1), ignore_index=-100)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-12
    torch_grads = {n: p.grad.numpy() for n, p in tm.named_parameters()}
    assert grads.keys() == torch_grads.keys()
    worst = max(rel_error(grads[n], torch_grads[n]) for n in grads)
    assert worst < 1e-6, worst


def test_gradients_match_finite_differences() -> None:
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=4)
    model = GPT(cfg, dtype=np.float64, seed=5)
    rng = np.random.default_rng(1)
    for _, p in model.named_parameters():  # O(1) weights: GPT-2's tiny init leaves gradients near FD noise
        p[...] = rng.normal(0.0, 0.5, p.shape)
    idx, tgt = rng.integers(0, 7, (2, 4)), rng.integers(0, 7, (2, 4))
    _, grads = model.loss_and_grads(idx, tgt)
    f = lambda: model.loss(idx, tgt)  # noqa: E731
    for name, p in model.named_parameters():  # every parameter tensor, all entries (the model is tiny)
        assert rel_error(grads[name], numerical_grad(f, p)) < 1e-6, name


def test_model_directory_round_trips_between_backends(tmp_path) -> None:
    model = GPT(CFG, seed=7)
    idx, _ = _batch(1)
    save_numpy_gpt(model, tmp_path / "m", eos_token_id=0)
    tm = load_model(tmp_path / "m")  # the PyTorch loader reads what the NumPy side wrote
    with torch.no_grad():
        torch_logits = tm(torch.from_numpy(idx))[0].numpy()
    assert np.abs(torch_logits - model.forward(idx)).max() < 1e-5
    back = load_numpy_gpt(tmp_path / "m")
    for (n, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
        assert np.array_equal(a, b), n
    assert np.array_equal(from_torch(tm).forward(idx), back.forward(idx))


def test_init_statistics_follow_gpt2() -> None:
    p = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=4, n_head=4, n_embd=64), seed=0).parameters()
    assert abs(p["transformer.wte.weight"].std() - 0.02) < 0.002
    assert abs(p["transformer.h.0.mlp.c_proj.weight"].std() - 0.02 / np.sqrt(8)) < 0.001
    assert not p["transformer.h.0.attn.c_attn.bias"].any()
    assert (p["transformer.ln_f.weight"] == 1).all()
