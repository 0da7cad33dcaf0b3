"""kernels/fused_ops (fused_ops.cpp): each fused step and its hand-written backward against the same arithmetic in
float64 autograd, at odd sizes (the vector loops' remainders), GQA and offset positions, with one thread and two;
a Llama's loss and every gradient under bf16 autocast (with either attention path) as close to float32's as the
plain PyTorch path's are; and
without the extension the model takes the plain path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinystack.kernels import fused_attention, fused_ops
from tinystack.model.llama import Llama, LlamaConfig, apply_rotary, rotary_table

pytestmark = pytest.mark.skipif(fused_ops.extension() is None, reason="needs the C++ extension (a C++ compiler)")
BF16 = torch.bfloat16


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max() / b.detach().double().abs().max())


@pytest.mark.parametrize("shape", [(3, 37), (2, 7, 576), (1, 1, 16)])
@pytest.mark.parametrize("train_gain", [True, False])
def test_rms_norm_and_its_gradients_match_float64(shape, train_gain, threads):
    torch.manual_seed(0)
    h = shape[-1]
    x = torch.randn(shape) * 3
    w = torch.rand(h) + 0.5
    gy = torch.randn(shape).to(BF16)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_(train_gain)
    ref = F.rms_norm(xr, (h,), wr, 1e-5)
    ref.backward(gy.double())
    xf, wf = x.clone().requires_grad_(), w.clone().requires_grad_(train_gain)
    y = fused_ops.rms_norm(xf, wf, 1e-5)
    y.backward(gy)
    assert y.dtype == BF16 and y.shape == x.shape
    assert rel(y, ref) < 8e-3  # one bf16 rounding of the output
    assert rel(xf.grad, xr.grad) < 1e-5  # float32 arithmetic on the bf16 gradient it was given
    if train_gain:
        assert rel(wf.grad, wr.grad) < 1e-5  # per-thread partial sums, added once
    else:
        assert wf.grad is None


@pytest.mark.parametrize("b,t,hq,hk,d", [(2, 5, 4, 2, 8), (1, 3, 9, 3, 64), (2, 4, 2, 2, 6)])
def test_rope_split_rotates_q_and_k_in_attention_layout(b, t, hq, hk, d, threads):
    torch.manual_seed(1)
    cos, sin = rotary_table(64, d, 10_000.0)
    pos = torch.arange(t).expand(b, t) + torch.tensor([[3], [11]])[:b]  # each row from its own offset
    c, s = cos[pos][:, :, None], sin[pos][:, :, None]
    qkv = torch.randn(b, t, hq + 2 * hk, d).to(BF16)
    grads = [torch.randn(b, h, t, d) for h in (hq, hk, hk)]
    xr = qkv.double().requires_grad_()
    rot = apply_rotary(xr[:, :, :hq + hk], c.double(), s.double())
    refs = [rot[:, :, :hq].transpose(1, 2), rot[:, :, hq:].transpose(1, 2), xr[:, :, hq + hk:].transpose(1, 2)]
    sum((r * g.double()).sum() for r, g in zip(refs, grads)).backward()
    xf = qkv.clone().requires_grad_()
    outs = fused_ops.rope_split(xf, c, s, hq, hk)
    sum((o * g).sum() for o, g in zip(outs, grads)).backward()
    for o, r in zip(outs, refs):
        assert o.dtype == torch.float32 and o.shape == r.shape and o.is_contiguous()
        assert rel(o, r) < 1e-6  # float32 rotation of the bf16 input, no rounding to bf16 in between
    assert xf.grad.dtype == BF16 and rel(xf.grad, xr.grad) < 8e-3  # one bf16 rounding


def test_rope_split_backward_when_only_q_is_used():
    torch.manual_seed(2)
    cos, sin = rotary_table(16, 8, 10_000.0)
    c, s = cos[:4][None, :, None], sin[:4][None, :, None]
    qkv = torch.randn(1, 4, 4, 8).to(BF16).requires_grad_()
    q, _, _ = fused_ops.rope_split(qkv, c, s, 2, 1)
    q.sum().backward()
    assert torch.equal(qkv.grad[:, :, 2:], torch.zeros_like(qkv.grad[:, :, 2:]))  # k and v: no gradient
    assert qkv.grad[:, :, :2].abs().sum() > 0


@pytest.mark.parametrize("n,i", [(5, 37), (64, 1536), (1, 16)])
def test_swiglu_and_its_gradient_match_float64(n, i, threads):
    torch.manual_seed(3)
    gu = (torch.randn(n, 2 * i) * 4).to(BF16)
    gu[0, :4] = torch.tensor([-100.0, 100.0, -88.5, 0.0])  # the exponential's clamps: still silu's values
    gh = torch.randn(n, i).to(BF16)
    gr = gu.double().requires_grad_()
    gate, up = gr.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    ref.backward(gh.double())
    gf = gu.clone().requires_grad_()
    h = fused_ops.swiglu(gf)
    h.backward(gh)
    assert h.dtype == BF16 and h.shape == (n, i)
    assert rel(h, ref) < 8e-3 and rel(gf.grad, gr.grad) < 8e-3  # float32 inside, one bf16 rounding out
    assert torch.isfinite(h).all() and torch.isfinite(gf.grad).all()


def test_swiglu_passes_nan_through():
    gu = torch.ones(1, 4, dtype=BF16)
    gu[0, 0] = float("nan")
    assert torch.isnan(fused_ops.swiglu(gu)[0, 0]) and torch.isfinite(fused_ops.swiglu(gu)[0, 1])


@pytest.mark.parametrize("shape", [(3, 37), (2, 7, 576), (1, 1, 1)])
def test_residual_add_is_the_mixed_dtype_add_and_sends_its_gradients_back_the_same(shape, threads):
    torch.manual_seed(5)
    x, y, g = torch.randn(shape) * 30, torch.randn(shape).to(BF16), torch.randn(shape)
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    ref = xs + ys  # PyTorch: float32 out, y's gradient back in bf16
    ref.backward(g)
    xf, yf = x.clone().requires_grad_(), y.clone().requires_grad_()
    out = fused_ops.residual_add(xf, yf)
    out.backward(g)
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    assert torch.equal(xf.grad, xs.grad) and yf.grad.dtype == BF16 and torch.equal(yf.grad, ys.grad)


def test_the_exponential_is_float32_accurate_over_its_whole_range(threads):
    """fused_ops.h's exp_f32, read through the float32 cross-entropy gradient rows, which write exp(l - lse) * scale:
    with lse 0 and scale 1 each entry but the target's is exp(l). Within 2 ulp of float64's exp where the result is
    a normal float, exactly 0 below -87 and for -inf, NaN for NaN."""
    x = torch.cat([torch.linspace(-87.0, 88.0, 400_001), torch.tensor([0.0, 1e-30, -1e-30, 88.0, -86.99])])
    row = torch.cat([torch.tensor([0.0]), x, torch.tensor([-87.5, -100.0, -float("inf"), float("nan")])])[None]
    one = torch.ones(1)
    got = fused_ops.extension().cross_entropy_grad(row, torch.tensor([0]), torch.zeros(1), one, False)[0, 1:]
    want = x.double().exp()
    ulps = ((got[: len(x)].double() - want).abs() / (want * 2.0**-23)).max()
    assert ulps <= 2.0, float(ulps)
    assert torch.equal(got[len(x):len(x) + 3], torch.zeros(3)) and torch.isnan(got[-1])


def _tiny_llama() -> Llama:
    torch.manual_seed(4)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, n_layer=2, n_head=4, n_kv_head=2,
                      head_dim=16, max_position_embeddings=64)
    model = Llama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # gains that matter
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10)  # attention far from uniform, so q and k get gradients worth comparing
    model.fuse_projections()
    return model.train()


def _loss_and_grads(model: Llama, idx: torch.Tensor, autocast: bool,
                    forward=None) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and every parameter's gradient, the forward run by `forward` (default: the model itself)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        logits = (model if forward is None else forward)(idx[:, :-1])[0]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if name.endswith("qkv_proj.weight"):  # q, k and v rows apart: v's gradient would hide a wrong q or k
            grads.update({f"{name}[{part}]": g for part, g in zip("qkv", p.grad.split([64, 32, 32]))})
        else:
            grads[name] = p.grad.clone()
    return loss.item(), grads


@pytest.mark.parametrize("attention", ["fused", "flash"])
def test_llama_under_bf16_autocast_is_as_close_to_float32_as_the_plain_path(attention, monkeypatch):
    # the attention path is chosen by timing on the machine (kernels/fused_attention.serves): both, pinned here
    monkeypatch.setattr(fused_attention, "serves", lambda q, k: attention == "fused" and fused_ops.active(q))
    model = _tiny_llama()
    idx = torch.randint(0, 97, (3, 17))
    ref_loss, ref = _loss_and_grads(model, idx, autocast=False)
    fused_loss, fused = _loss_and_grads(model, idx, autocast=True)
    monkeypatch.setattr(fused_ops, "active", lambda x: False)
    plain_loss, plain = _loss_and_grads(model, idx, autocast=True)
    assert set(fused) == set(plain) == set(ref)
    assert abs(fused_loss - ref_loss) <= max(2 * abs(plain_loss - ref_loss), 5e-3)
    for name in ref:
        err_fused = float((fused[name] - ref[name]).norm() / ref[name].norm())
        err_plain = float((plain[name] - ref[name]).norm() / ref[name].norm())
        assert err_fused <= max(1.5 * err_plain, 0.02), (name, err_fused, err_plain)


def test_a_compiled_llama_under_bf16_autocast_trains_like_the_eager_fused_one():
    """`[train] compile` on a Llama under bf16 autocast: torch.compile traces the model with fake tensors, which the
    C++ operators cannot take (it raised at the first RMSNorm). The traced model takes the plain ops instead and
    gives the eager (fused) model's loss and gradients to bf16's tolerance."""
    model = _tiny_llama()
    idx = torch.randint(0, 97, (3, 17))
    eager_loss, eager = _loss_and_grads(model, idx, autocast=True)
    compiled_loss, grads = _loss_and_grads(model, idx, autocast=True, forward=torch.compile(model))
    assert abs(compiled_loss - eager_loss) <= 2e-2 * abs(eager_loss)
    for name in eager:
        err = float((grads[name] - eager[name]).norm() / eager[name].norm())
        assert err <= 0.05, (name, err)


def test_the_fused_path_runs_only_under_cpu_bf16_autocast_with_the_extension(monkeypatch):
    x = torch.randn(2, 3)
    assert not fused_ops.active(x)
    with torch.autocast("cpu", dtype=BF16):
        assert fused_ops.active(x)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not fused_ops.active(x)
    monkeypatch.setattr(fused_ops, "extension", lambda: None)  # no compiler: the model's plain ops
    with torch.autocast("cpu", dtype=BF16):
        assert not fused_ops.active(x)
        logits = _tiny_llama()(torch.randint(0, 97, (1, 5)))[0]
    assert torch.isfinite(logits).all()

