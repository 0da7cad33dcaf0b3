"""LoRA's fused AMX product (kernels/lora_amx.py, lora_amx.cpp) against the library path it replaces and against
float64: the tile packing, both directions for one adapter and for fused layers (P r above 32 included), the
choice between the two ways measured once per shape, and LoRALinear through it: outputs and gradients as
autograd's own bf16 graph, adapters repacked after an optimiser step, a backward using its own forward's B.

Runs on CPUs with AMX BF16 only (elsewhere nothing is compiled and LoRA takes the library path, which
test_finetune_lora.py holds to autograd)."""
import pytest
import torch
from train_helpers import lora_bf16_paths

from tinystack.kernels import cpu, lora_amx, matmul_plan
from tinystack.train.lora import LoRALinear

# where the CPU has AMX the kernels must build and run: a compile error fails here instead of skipping
pytestmark = pytest.mark.skipif(not cpu.has_amx(), reason="needs a CPU with AMX BF16")


def test_the_kernels_build_and_run_where_the_cpu_has_amx():
    assert lora_amx.ops() is not None and lora_amx.ops().available()
    assert lora_amx.refusal(torch.zeros(64, 96, dtype=torch.bfloat16)) is None


def _reference_pack(src, trans):
    """pack()'s layout written with tensor ops: B = src^T or src padded to multiples of 32, then tiles of
    (16 columns, 32 rows of K) whose row p holds B[2p][n], B[2p + 1][n] for each column n."""
    b = src.t() if trans else src
    k, n = b.shape
    kp, np_ = -(-k // 32) * 32, -(-n // 32) * 32
    padded = torch.zeros(kp, np_, dtype=src.dtype)
    padded[:k, :n] = b
    return padded.view(kp // 32, 16, 2, np_ // 16, 16).permute(3, 0, 1, 4, 2).reshape(-1)


@pytest.mark.parametrize("shape", [(3072, 16), (576, 24), (24, 576), (96, 64), (40, 70), (33, 7)])
@pytest.mark.parametrize("trans", [True, False])
def test_pack_lays_out_tiles_as_specified(shape, trans):
    src = torch.randn(*shape).bfloat16()
    assert torch.equal(lora_amx.ops().pack(src, trans), _reference_pack(src, trans))


def _case(rows, inp, out, sizes, rank, bias, seed=0):
    """A fused layer's operands: frozen W (bf16), adapters A [P r, in] and B [rows of B, r] (float32)."""
    g = torch.Generator().manual_seed(seed)
    spans, row = [], 0
    for size in sizes:
        spans += [row, size]
        row += size
    assert row == out
    w = (torch.randn(out, inp, generator=g) / inp ** 0.5).bfloat16()
    a = torch.randn(len(sizes) * rank, inp, generator=g) / inp ** 0.5
    b = torch.randn(out, rank, generator=g)
    x = torch.randn(rows, inp, generator=g).bfloat16()
    grad = torch.randn(rows, out, generator=g).bfloat16()
    return w, a, b, x, grad, spans, (torch.randn(out, generator=g).bfloat16() if bias else None)


def _spread(b, spans, rank, scale):
    full = torch.zeros(sum(spans[1::2]), len(spans) // 2 * rank)
    b_row = 0
    for j in range(len(spans) // 2):
        row, size = spans[2 * j], spans[2 * j + 1]
        full[row:row + size, j * rank:(j + 1) * rank] = b[b_row:b_row + size] * scale
        b_row += size
    return full.bfloat16()


CASES = [  # rows, in, out, parts' sizes, rank: one adapter (P r = 8), two (16), q/k/v-like, gate/up-like, P r = 40
    (64, 64, 96, [96], 8), (64, 64, 128, [64, 64], 8), (96, 64, 160, [64, 64, 32], 8), (128, 96, 128, [64, 64], 16),
    (64, 64, 96, [64, 32], 20)]


@pytest.mark.parametrize("rows, inp, out, sizes, rank", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_fused_product_equals_the_library_product_and_float64(rows, inp, out, sizes, rank, bias):
    """y, x A^T and the three gradients against the library calls (linear_ops.cpp, what runs without AMX) and
    against float64 on the same bf16 operands: within bf16 rounding of the float64 values, as the library is."""
    w, a, b, x, grad, spans, bias_t = _case(rows, inp, out, sizes, rank, bias)
    scale = 2.0
    lib = matmul_plan.linear_ops()
    b_copy, packed = lora_amx.prepare(w, a, b, scale, spans, rank, None)
    assert torch.equal(b_copy, b) and torch.equal(packed.a, a) and b_copy.data_ptr() != b.data_ptr()
    y, xa = lora_amx.forward(x, packed, bias_t)
    sb = _spread(b, spans, rank, scale)
    y_lib, _, xa_lib = lib.lora_fwd(x, w, sb, bias_t, a.bfloat16(), 1)
    pr = a.shape[0]
    assert xa.shape == (rows, -(-pr // 32) * 32) and torch.count_nonzero(xa[:, pr:]) == 0
    # float64 on the same operands, the rank product from the bf16 xa as both ways round it
    xd, wd, ad, sbd, gd = x.double(), w.double(), a.bfloat16().double(), sb.double(), grad.double()
    xa_d = xd @ ad.t()
    y_d = xd @ wd.t() + xa[:, :pr].double() @ sbd.t() + (bias_t.double() if bias else 0)
    for got, ref in ((y, y_d), (y_lib, y_d), (xa[:, :pr], xa_d), (xa_lib, xa_d)):
        assert (got.double() - ref).abs().max() <= 0.01 * ref.abs().max()
    for need_x in (True, False):
        grad_x, grad_a, grad_b = lora_amx.backward(grad, packed, x, xa, need_x, spans, rank, scale)
        lib_x, lib_a, lib_b = lib.lora_bwd(grad, w, sb, x, xa_lib, a.bfloat16(), need_x, spans, rank, scale, 1)
        g_xa = (gd @ sbd).bfloat16().double()  # both ways round g (s B) to bf16 before using it
        ref_a = g_xa.t() @ xd
        whole = gd.t() @ xa[:, :pr].double()
        ref_b = torch.cat([whole[spans[2 * j]:spans[2 * j] + spans[2 * j + 1], j * rank:(j + 1) * rank]
                           for j in range(len(spans) // 2)]) * scale
        assert grad_a.dtype == grad_b.dtype == torch.float32 and grad_b.shape == b.shape
        for got, ref in ((grad_a, ref_a), (lib_a, ref_a), (grad_b, ref_b), (lib_b, ref_b)):
            assert (got.double() - ref).abs().max() <= 0.01 * ref.abs().max()
        if need_x:
            ref_x = gd @ wd + g_xa @ ad
            for got in (grad_x, lib_x):
                assert (got.double() - ref_x).abs().max() <= 0.01 * ref_x.abs().max()
        else:
            assert grad_x is None and lib_x is None


def test_the_choice_is_measured_once_per_shape_and_kept(monkeypatch):
    """takes() times both ways on the first input of a shape (matmul_plan.fastest) and keeps the verdict; rows
    that are not a multiple of 32, or no packed operands, never run fused and are never timed."""
    w, a, b, x, grad, spans, _ = _case(64, 64, 96, [96], 8, False)
    _, packed = lora_amx.prepare(w, a, b, 2.0, spans, 8, None)
    monkeypatch.setattr(lora_amx, "_plans", {})
    timed = []
    real = lora_amx._measure
    monkeypatch.setattr(lora_amx, "_measure", lambda *args: timed.append(args[0].shape) or real(*args))
    sb = lambda: _spread(b, spans, 8, 2.0)  # noqa: E731
    first = lora_amx.takes(x, packed, sb, None, spans, 8, 2.0)
    assert all(lora_amx.takes(x, packed, sb, None, spans, 8, 2.0) == first for _ in range(3))
    assert timed == [x.shape] and list(lora_amx.plans().values()) == [first]
    assert not lora_amx.takes(x[:40], packed, sb, None, spans, 8, 2.0)  # 40 rows
    assert not lora_amx.takes(x, None, sb, None, spans, 8, 2.0)
    assert timed == [x.shape]
    monkeypatch.setattr(lora_amx, "_plans", {})
    monkeypatch.setattr(matmul_plan, "fastest", lambda ways, margin=1.0: "library")
    monkeypatch.setattr(lora_amx, "fastest", lambda ways, margin=1.0: "library")
    assert not lora_amx.takes(x, packed, sb, None, spans, 8, 2.0)


def test_prepare_refuses_what_the_kernels_cannot_take():
    w, a, b, *_ = _case(64, 64, 96, [96], 8, False)
    assert lora_amx.prepare(w.float(), a, b, 2.0, [0, 96], 8, None) is None  # float32: the library path
    assert lora_amx.prepare(w[:, :40].contiguous(), a[:, :40], b, 2.0, [0, 96], 8, None) is None  # in = 40


def _fused_layer(monkeypatch, parts=None):
    monkeypatch.setattr(lora_amx, "_plans", {})
    monkeypatch.setattr(lora_amx, "_measure", lambda *args: True)  # always fused: what these tests hold
    torch.manual_seed(0)
    lora = LoRALinear(torch.nn.Linear(64, 96), rank=8, alpha=16, parts=parts)
    with torch.no_grad():
        lora.lora_B.normal_()
    return lora


@pytest.mark.parametrize("parts", [None, ([32, 32, 32], [True, False, True])])
def test_lora_linear_through_the_fused_product_matches_autograd(parts, monkeypatch):
    """Under bf16 autocast, rows a multiple of 32: the layer runs the fused product (seen) and its output and
    gradients are autograd's bf16 graph of the same layer, up to bf16 rounding."""
    lora = _fused_layer(monkeypatch, parts)
    calls = []
    forward = lora_amx.forward
    monkeypatch.setattr(lora_amx, "forward", lambda *args: calls.append(1) or forward(*args))
    outs = lora_bf16_paths(lora, torch.randn(2, 32, 64, requires_grad=True), torch.randn(2, 32, 96))
    assert calls == [1]
    for fused, ref in zip(*outs):
        assert (fused - ref).norm() <= 0.02 * ref.norm()


def test_adapters_are_repacked_after_a_step_and_a_backward_uses_its_forwards_b(monkeypatch):
    """The fused AdamW step writes A and B without bumping their version counters: the next forward still sees
    the new values (a fresh layer with the same weights gives the same output); and B changed between a forward
    and its backward leaves that backward on the forward's B."""
    lora = _fused_layer(monkeypatch)
    x = torch.randn(64, 64)
    opt = torch.optim.AdamW([lora.lora_A, lora.lora_B], lr=0.1, fused=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lora(x).float().sum().backward()
    opt.step()
    twin = _fused_layer(monkeypatch)
    twin.load_state_dict(lora.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(lora(x), twin(x))
        y = lora(x)
    g = torch.randn(64, 96).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_grad = torch.autograd.grad(twin(x), twin.lora_A, g)[0]
    with torch.no_grad():
        lora.lora_B.add_(1.0)  # between this forward and its backward
    assert torch.equal(torch.autograd.grad(y, lora.lora_A, g)[0], ref_grad)


def test_fastest_keeps_the_first_way_unless_another_wins_by_the_margin():
    import time
    slow, fast = (lambda: time.sleep(0.002)), (lambda: None)
    assert matmul_plan.fastest({"a": slow, "b": fast}) == "b"
    assert matmul_plan.fastest({"a": fast, "b": slow}) == "a"
    assert matmul_plan.fastest({"a": slow, "b": fast}, margin=0.0) == "a"  # nothing beats 0 x the first


def test_reused_buffers_give_fresh_results_and_a_stale_backward_fails_loudly(monkeypatch):
    """From the third preparation on, a layer writes its packed A and s B over the buffers of the one before last
    (only where values go: the zeros stay). Over several optimiser steps its outputs equal a fresh layer's with the
    same weights; and a backward whose forward's buffers were written over since refuses to run (autograd's
    version check) instead of using other adapters than its forward did."""
    lora = _fused_layer(monkeypatch, ([32, 32, 32], [True, False, True]))
    x = torch.randn(64, 64)
    opt = torch.optim.AdamW([lora.lora_A, lora.lora_B], lr=0.05, fused=True)
    buffers = set()
    for _ in range(4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lora(x)
        buffers.add(lora._weight_copy.packed.adapters.data_ptr())
        twin = _fused_layer(monkeypatch, ([32, 32, 32], [True, False, True]))
        twin.load_state_dict(lora.state_dict())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(y, twin(x))
        y.float().square().sum().backward()
        opt.step()
        opt.zero_grad()
    assert len(buffers) == 2  # two sets in turn
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stale = lora(x)
        for _ in range(2):
            with torch.no_grad():
                lora.lora_B.add_(0.5)
            fresh = lora(x)  # the second of these writes over `stale`'s buffers
    fresh.float().sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.float().sum().backward()
