"""kernels/fused_attention (fused_attention.cpp): causal attention and its hand-written backward against float64
scaled_dot_product_attention, grouped-query and not, at lengths that are not a multiple of the vector width,
with batches that split evenly over the threads and batches that do not (the two ways the kernel parallelises),
with one thread and two; the causal mask holds exactly; and when the path serves a call."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinystack.kernels import fused_attention, fused_ops
from tinystack.model.attention import causal_attention

pytestmark = pytest.mark.skipif(fused_ops.extension() is None, reason="needs the C++ extension (a C++ compiler)")
BF16 = torch.bfloat16


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest error relative to the reference's largest value, or to 1e-12 where the reference is zero up to float64
    rounding: T = 1 gives dq = 0 in theory, which SDPA's float64 backward computes as 0 on one CPU and as ~3e-16 on
    another (AVX2 AMD EPYC), against our exact 0."""
    err = (a.detach().double() - b.detach().double()).abs().max()
    return float(err / max(float(b.detach().double().abs().max()), 1e-12))


@pytest.mark.parametrize("b, h, kv, t, d", [(2, 6, 2, 37, 16), (3, 4, 4, 20, 32), (1, 9, 3, 64, 64), (4, 2, 1, 1, 8)])
@pytest.mark.parametrize("in_dtype", [torch.float32, BF16])
def test_attention_and_its_gradients_match_float64(b, h, kv, t, d, in_dtype, threads):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, t, d) * s for n, s in ((h, 2.0), (kv, 2.0), (kv, 1.0)))  # peaked softmax rows
    g = torch.randn(b, h, t, d)
    refs = [x.double().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, is_causal=True, enable_gqa=kv != h)
    ref.backward(g.double())
    ins = [x.to(in_dtype).requires_grad_() for x in (q, k, v)]
    out = fused_attention.attention(*ins)
    out.backward(g.to(BF16))
    assert out.dtype == BF16 and out.shape == (b, h, t, d)
    assert rel(out, ref) < 2e-2
    for x, r, name in zip(ins, refs, "qkv"):
        assert x.grad.dtype == in_dtype, name
        assert rel(x.grad, r.grad) < 4e-2, (name, rel(x.grad, r.grad))


def test_a_query_never_sees_later_keys(threads):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 6, 40, 16), torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    out = fused_attention.attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 25:] += 100.0  # change only keys and values from position 25 on
    v2[:, :, 25:] -= 100.0
    out2 = fused_attention.attention(q, k2, v2)
    assert torch.equal(out[:, :, :25], out2[:, :, :25])
    assert not torch.equal(out[:, :, 25:], out2[:, :, 25:])


def test_serves_only_bf16_autocast_small_enough_and_measured_faster(monkeypatch):
    calls = []
    monkeypatch.setattr(fused_attention, "_faster", {})
    monkeypatch.setattr(fused_attention, "_measure", lambda *shape: calls.append(shape) or True)
    q, k = torch.randn(2, 6, 50, 16), torch.randn(2, 3, 50, 16)
    assert not fused_attention.serves(q, k)  # no autocast: float32 training keeps torch's kernel
    with torch.autocast("cpu", dtype=BF16):
        assert fused_attention.serves(q, k)
        assert fused_attention.serves(q[:, :, :40], k[:, :, :40])  # the same class: T 40 and 50 both round to 64
        assert calls == [(2, 6, 3, 64, 16)]  # measured once, at the class's length
        big = fused_attention.MAX_SAVED_BYTES // (2 * 6 * 2) + 1  # B H T^2 bf16 over the limit
        t = int(big**0.5) + 1
        assert not fused_attention.serves(torch.empty(2, 6, t, 16), torch.empty(2, 3, t, 16))
    monkeypatch.setattr(fused_attention, "_measure", lambda *shape: False)  # measured slower: flash attention
    monkeypatch.setattr(fused_attention, "_faster", {})
    with torch.autocast("cpu", dtype=BF16):
        assert not fused_attention.serves(q, k)


def test_the_measurement_times_both_paths_and_answers(monkeypatch):
    assert isinstance(fused_attention._measure(1, 4, 2, 32, 16), bool)
    with torch.inference_mode():  # an evaluation's forward may be the first to ask
        assert isinstance(fused_attention._measure(1, 4, 2, 16, 16), bool)


def test_causal_attention_takes_the_path_under_autocast_and_falls_back_with_dropout(monkeypatch):
    monkeypatch.setattr(fused_attention, "serves", lambda q, k: True)
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    with torch.autocast("cpu", dtype=BF16):
        assert causal_attention(q, k, v, 0).dtype == BF16  # this path
        assert causal_attention(q, k, v, 0, dropout_p=0.5).dtype == torch.float32  # flash, float32: has dropout
