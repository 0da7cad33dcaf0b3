"""kernels/matmul_plan.py (products planned per shape), linear_ops.cpp's rows_mm, and train/planned_linear.py (the
training's linear layers through them), against torch.mm and nn.Linear."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from tinystack.kernels import matmul_plan
from tinystack.train import planned_linear
from tinystack.train.planned_linear import PlannedLinear, plan_linears

needs_ops = pytest.mark.skipif(matmul_plan.linear_ops() is None, reason="needs the C++ extension (a C++ compiler)")


@needs_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("m, k, n", [(200, 48, 40), (64, 16, 24), (33, 8, 5), (1000, 64, 3)])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("b_transposed", [False, True])
def test_rows_mm_equals_mm(dtype, m, k, n, parts, b_transposed):
    """Each row block's product is the library's product of those rows: the same numbers as one call, for any
    row count (blocks of 32-row multiples, a short last one), thread count and b layout."""
    torch.manual_seed(0)
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn(n, k, dtype=dtype).t() if b_transposed else torch.randn(k, n, dtype=dtype)
    got = matmul_plan.linear_ops().rows_mm(a, b, parts)
    ref = (a.double() @ b.double()).to(dtype)
    assert got.shape == (m, n) and got.dtype == dtype and got.is_contiguous()
    tol = {torch.float64: 1e-12, torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
    assert torch.allclose(got.double(), ref.double(), rtol=tol, atol=tol * k ** 0.5)


@needs_ops
def test_rows_mm_rejects_mismatched_shapes():
    with pytest.raises(RuntimeError, match=r"rows_mm: a \[M, K\], b \[K, N\]"):
        matmul_plan.linear_ops().rows_mm(torch.randn(4, 3), torch.randn(4, 3), 2)


@needs_ops
def test_a_shape_is_planned_once_per_key_and_mm_follows_the_plan(monkeypatch):
    """The first product of a (shapes, strides, dtype, threads) is timed, later ones reuse the plan; another
    layout or dtype of the same shape is a plan of its own; mm gives a @ b whichever way was planned."""
    monkeypatch.setattr(matmul_plan, "_plans", {})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    measured = []
    real = matmul_plan._measure

    def spy(a, b, threads, ops):
        measured.append((tuple(a.shape), b.stride(), a.dtype, threads))
        return real(a, b, threads, ops)

    monkeypatch.setattr(matmul_plan, "_measure", spy)
    a, w = torch.randn(256, 32), torch.randn(48, 32)
    for _ in range(3):
        out = matmul_plan.mm(a, w.t())
        assert torch.allclose(out, a @ w.t(), atol=1e-5)
    assert measured == [((256, 32), (1, 32), torch.float32, 2)]
    matmul_plan.mm(a, w.t().contiguous())  # same shapes, another layout of b
    matmul_plan.mm(a.bfloat16(), w.t().bfloat16())  # another dtype
    assert len(measured) == 3 and len(matmul_plan.plans()) == 3
    assert set(matmul_plan.plans().values()) <= {1, 2}


def test_one_thread_few_rows_or_no_compiler_is_one_call_never_timed(monkeypatch):
    monkeypatch.setattr(matmul_plan, "_plans", {})
    monkeypatch.setattr(matmul_plan, "_measure", lambda *a: pytest.fail("timed"))
    a, b = torch.randn(512, 16), torch.randn(16, 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert matmul_plan.row_parts(a, b) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert matmul_plan.row_parts(a[: 4 * matmul_plan.MIN_ROWS_PER_PART - 1], b) == 1  # under 64 rows a thread
    monkeypatch.setattr(matmul_plan, "linear_ops", lambda: None)
    assert matmul_plan.row_parts(a, b) == 1 and matmul_plan.plans() == {(tuple(a.shape), a.stride(),
                                                                         tuple(b.shape), b.stride(), a.dtype, 4): 1}


def _pair(bias: bool, dtype=torch.float32):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(24, 40, bias=bias), nn.GELU(), nn.Linear(40, 24, bias=bias)).to(dtype)
    planned = copy.deepcopy(ref)
    assert plan_linears(planned) == 2
    return ref, planned


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_planned_linear_matches_nn_linear_in_float64(bias, split, monkeypatch):
    """Values and gradients (input, weight, bias) of nn.Linear to float64 rounding, with the products in one
    call and with their rows split (forced: 96 rows, blocks of 64 and 32), and gradcheck's own check."""
    if split:
        if matmul_plan.linear_ops() is None:
            pytest.skip("needs the C++ extension (a C++ compiler)")
        monkeypatch.setattr(matmul_plan, "row_parts", lambda a, b: 2)
    ref, planned = _pair(bias, torch.float64)
    x = torch.randn(3, 32, 24, dtype=torch.float64, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y, yr = planned(x), ref(xr)
    assert torch.allclose(y, yr, atol=1e-12)
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g)
    assert torch.allclose(x.grad, xr.grad, atol=1e-12)
    for p, q in zip(planned.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-12)
    layer = planned[0]
    assert torch.autograd.gradcheck(
        lambda x, w, *b: torch.func.functional_call(layer, {"weight": w, **({"bias": b[0]} if b else {})}, (x,)),
        (x[:1, :5].detach().requires_grad_(), layer.weight, *([layer.bias] if bias else [])))


def test_planned_linear_under_bf16_autocast_matches_nn_linear():
    """Under bf16 autocast: bf16 output, float32 parameter gradients, both as nn.Linear's within bf16 rounding;
    a frozen layer uses its kept bf16 copy and gives the input's gradient only."""
    ref, planned = _pair(True)
    x = torch.randn(4, 64, 24, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, yr = planned(x), ref(xr)
    assert y.dtype == yr.dtype == torch.bfloat16
    assert torch.allclose(y.float(), yr.float(), rtol=2e-2, atol=2e-2)
    y.float().square().mean().backward()
    yr.float().square().mean().backward()
    for p, q in [(x, xr), *zip(planned.parameters(), ref.parameters())]:
        assert p.grad.dtype == torch.float32
        assert (p.grad - q.grad).abs().max() <= 2e-2 * q.grad.abs().max()
    planned.requires_grad_(False)
    grads = [p.grad.clone() for p in planned.parameters()]
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        planned(x).float().sum().backward()
    assert x.grad is not None and all(torch.equal(p.grad, g) for p, g in zip(planned.parameters(), grads))
    assert planned_linear.kept_cast(planned[0].weight, torch.bfloat16) is planned_linear.kept_cast(
        planned[0].weight, torch.bfloat16)


def test_plan_linears_keeps_parameters_ties_and_state_dict():
    """The swap keeps the very Parameter objects (a tied head stays tied to the embedding, an optimiser built
    before still holds them), the state_dict's names and values, the train/eval mode; a second call swaps none."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"emb": nn.Embedding(10, 8), "proj": nn.Linear(8, 8), "head": nn.Linear(8, 10, bias=False)})
    model.head.weight = model.emb.weight
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    assert plan_linears(model) == 2
    assert type(model.proj) is PlannedLinear and type(model.head) is PlannedLinear
    assert model.head.weight is model.emb.weight and list(model.parameters()) == params
    assert not model.proj.training
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert plan_linears(model) == 0


def test_planned_layers_compile_with_torch_compile(monkeypatch):
    """Under torch.compile (`[train] compile`) the layers are traced with fake tensors: nothing is timed (no plan
    made yet, two threads: a plan would be due), and the compiled PlannedLinear and LoRA layers give eager's values
    and gradients."""
    from tinystack.train.lora import LoRALinear

    monkeypatch.setattr(matmul_plan, "_plans", {})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), LoRALinear(nn.Linear(64, 32), 4, 8.0))
    with torch.no_grad():
        model[2].lora_B.normal_()
    plan_linears(model)
    x = torch.randn(256, 32)
    grads = []
    for run in (torch.compile(model), model):  # compiled first: its shapes not planned yet
        xi = x.clone().requires_grad_()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            y = run(xi)
            y.square().sum().backward()
        grads.append((y.detach(), xi.grad, model[0].weight.grad.clone(), model[2].lora_A.grad.clone()))
        model.zero_grad()
        # the tracer never reaches the C++ operators or the cached builder that loads them
        assert not [w for w in seen if "lru_cache" in str(w.message)], [str(w.message) for w in seen]
    # compiled code sums in its own order (float32 rounding), so compare as a whole, relative to each tensor
    assert all((a - b).norm() <= 1e-5 * b.norm() for a, b in zip(*grads)), [
        ((a - b).norm() / b.norm()).item() for a, b in zip(*grads)]
