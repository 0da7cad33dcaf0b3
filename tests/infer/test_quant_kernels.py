"""Weight formats and their kernels: GGUF's byte layouts, round-trip error, every kernel path against a
float reference on odd shapes, and whole models with quantised linear layers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tinystack.infer.quant import kernels
from tinystack.infer.quant.formats import (
    FORMATS,
    dequantize,
    dequantize_numpy,
    from_gguf,
    quantize,
    quantize_torch,
    to_gguf,
)
from tinystack.infer.quant.linear import QuantEmbedding, QuantLinear, head_format, quantize_model
from tinystack.kernels import quant as quant_kernels

BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1")
PATHS = quant_kernels.available_paths()


def weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 0.1
    w[0, :5] = 0.0  # a partly zero block, and ties in magnitude (Q4_0 takes the first of them)
    w[-1, -3:] = torch.tensor([0.05, -0.05, 0.05])[: min(3, k)]
    return w


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_block_layout_is_gguf_byte_for_byte(fmt):
    gguf = pytest.importorskip("gguf")  # the reference: llama.cpp's quantisers ported to numpy
    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    w = weights(7, 96)
    want = gguf.quants.quantize(w.numpy(), qtype)
    for ours in (quantize(w, fmt), quantize_torch(w, fmt)):  # the C++ packer (where built) and the torch one
        assert np.array_equal(to_gguf(ours).numpy(), want)
    back = from_gguf(torch.from_numpy(want.copy()), fmt, 96)  # loading GGUF data needs no re-quantising
    for deq in (dequantize, dequantize_numpy):
        assert np.array_equal(deq(back).numpy(), gguf.quants.dequantize(want, qtype))


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_packers_agree_on_odd_shapes(fmt):
    for n, k in ((3, 31), (17, 577), (1, 1)):
        w = weights(n, k, seed=k)
        a, b = quantize(w, fmt), quantize_torch(w, fmt)
        for x, y in ((a.qs, b.qs), (a.d, b.d), (a.m, b.m)):
            assert (x is None and y is None) or torch.equal(x, y)
        assert torch.equal(dequantize(a), dequantize_numpy(a)) and dequantize(a).shape == (n, k)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(5, 32), (3, 31), (9, 100), (4, 577)])
def test_round_trip_error_is_bounded_per_block(fmt, shape):
    w = weights(*shape, seed=shape[1])
    back = dequantize(quantize(w, fmt))
    assert back.shape == w.shape
    if fmt == "bf16":
        assert ((back - w).abs() <= w.abs() * 2**-8).all()
        return
    pad = -shape[1] % 32
    blocks = torch.nn.functional.pad(w, (0, pad)).view(shape[0], -1, 32)
    err = torch.nn.functional.pad(back - w, (0, pad)).view_as(blocks).abs().amax(-1)
    amax, lo, hi = blocks.abs().amax(-1), blocks.amin(-1), blocks.amax(-1)
    fp16 = 2**-10  # d (and m) are stored in fp16
    bound = {"q8_0": amax / 254 + amax * fp16,
             "q4_0": amax / 8 + amax * fp16,  # -max lands one step short of the 4-bit range's end
             "q4_1": (hi - lo) / 30 + (hi - lo + lo.abs()) * fp16}[fmt]
    assert (err <= bound + 1e-9).all()
    assert (back[w == 0] == 0).all() or fmt == "q4_1"  # symmetric formats keep zeros exact


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """What the C++ kernels multiply by: x rounded per block of 32 to int8 with d = max|x| / 127."""
    k = x.shape[1]
    blocks = torch.nn.functional.pad(x, (0, -k % 32)).view(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d.clamp(min=1e-30), torch.zeros_like(d))
    return (torch.round(blocks * inv) * d).view(x.shape[0], -1)[:, :k]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(37, 100), (64, 576), (5, 33), (130, 1536)])
def test_matmul_matches_the_dequantised_reference(path, fmt, n, k):
    w, bias = weights(n, k, seed=n + k), torch.randn(n, generator=torch.Generator().manual_seed(1))
    p = quantize(w, fmt)
    wd = dequantize(p)
    for rows in list(range(1, 18)) + [kernels.GEMM_MIN_ROWS + 3]:
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        kernel_rounds_x = path != "torch" and fmt != "bf16" and rows < kernels.GEMM_MIN_ROWS
        xr = quantized_activations(x) if kernel_rounds_x else x
        want = xr @ wd.T + bias
        scale = xr.abs() @ wd.abs().T  # float32 rounding grows with the sum of |terms|
        got = kernels.matmul(x, p, bias, path=path)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        assert ((got - want).abs() <= 1e-5 * scale + 1e-6).all(), (rows, (got - want).abs().max())
        if kernel_rounds_x:  # and the activation rounding itself stays small against the float product
            exact = x @ wd.T + bias
            assert ((got - exact).abs() <= 0.02 * (x.abs() @ wd.abs().T) + 1e-6).all()


def test_decode_arithmetic_sends_long_inputs_through_the_kernels():
    """dtype="auto" scores quality on a long sequence: it must see decode's int8-activation arithmetic, row by row
    the same as one-row calls, not prefill's float GEMM."""
    if "cpp" not in quant_kernels.available_paths():
        pytest.skip("the C++ extension could not be built here (kernel tests above cover the torch path)")
    p = quantize(weights(40, 96), "q4_1")
    x = torch.randn(kernels.GEMM_MIN_ROWS + 5, 96, generator=torch.Generator().manual_seed(3))
    one_row = torch.cat([kernels.matmul(x[i:i + 1], p) for i in range(len(x))])
    with kernels.decode_arithmetic():
        scored = kernels.matmul(x, p)
    assert torch.allclose(scored, one_row, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(kernels.matmul(x, p), one_row, rtol=1e-6, atol=1e-6)  # outside: the float GEMM


def test_the_paths_agree_and_the_env_var_forces_one(monkeypatch):
    p = quantize(weights(48, 200), "q4_1")
    x = torch.randn(3, 200)
    outs = {path: kernels.matmul(x, p, path=path) for path in PATHS}
    for simd in ("avx512", "avx2"):  # the same integer dot products, summed in another order
        if simd in outs:
            assert torch.allclose(outs[simd], outs["cpp"], rtol=1e-5, atol=1e-5)
    for path in PATHS:
        monkeypatch.setenv("TINYSTACK_QUANT_KERNEL", path)
        quant_kernels.default_path.cache_clear()
        assert quant_kernels.default_path() == path
        assert torch.equal(kernels.matmul(x, p), outs[path])
    monkeypatch.setenv("TINYSTACK_QUANT_KERNEL", "fastest")
    quant_kernels.default_path.cache_clear()
    with pytest.raises(ValueError, match="TINYSTACK_QUANT_KERNEL"):
        quant_kernels.default_path()
    monkeypatch.delenv("TINYSTACK_QUANT_KERNEL")
    quant_kernels.default_path.cache_clear()


def test_rejects_mismatched_shapes():
    p = quantize(weights(8, 64), "q8_0")
    for path in PATHS:
        with pytest.raises(RuntimeError, match="columns" if path != "torch" else "shapes"):
            kernels.matmul(torch.randn(2, 100), p, path=path)
    with pytest.raises(ValueError, match="unknown weight format"):
        quantize(weights(8, 64), "q3_k")


def tiny_models():
    from tinystack.model import GPT, GPTConfig
    from tinystack.model.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=211, block_size=32, n_layer=2, n_head=2, n_embd=48))
    llama = Llama(LlamaConfig(vocab_size=211, hidden_size=64, intermediate_size=96, n_layer=2, n_head=4, n_kv_head=2,
                              tie_word_embeddings=False, attention_bias=True))
    tied = Llama(LlamaConfig(vocab_size=211, hidden_size=64, intermediate_size=96, n_layer=2, n_head=4, n_kv_head=2,
                             tie_word_embeddings=True))
    return {"gpt": gpt, "llama": llama, "llama_tied": tied}


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_model_keeps_logits_close_and_weights_small(fmt):
    import copy

    idx = torch.randint(0, 211, (2, 12), generator=torch.Generator().manual_seed(0))
    for name, model in tiny_models().items():
        q = copy.deepcopy(model)
        report = quantize_model(q, fmt)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert report["layers"] == len(linears) and not any(isinstance(m, torch.nn.Linear) for m in q.modules())
        assert sum(isinstance(m, QuantLinear) for m in q.modules()) == len(linears)
        tied = name != "llama"
        assert any(isinstance(m, QuantEmbedding) for m in q.modules()) == tied  # the tied table is the packed head
        block_bytes = {"bf16": 64, "q8_0": 34, "q4_0": 18, "q4_1": 20}  # per 32 weights (K zero-padded)
        want = sum(m.out_features * -(-m.in_features // 32) * block_bytes[head_format(fmt) if m is model.lm_head
                                                                          else fmt] for m in linears)
        assert report["bytes_after"] == want and report["bytes_before"] == 4 * sum(m.weight.numel() for m in linears)
        with torch.no_grad():
            for batch in (idx, idx[:1, :1]):  # 24 rows and one decode row
                a, b = model(batch)[0], q(batch)[0]
                tol = {"bf16": 0.02, "q8_0": 0.05, "q4_0": 0.3, "q4_1": 0.3}[fmt]
                assert (a - b).abs().max() <= tol * a.abs().max(), (name, (a - b).abs().max() / a.abs().max())


def test_without_a_compiler_the_torch_path_runs_with_one_warning(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(*a, **k):
        raise RuntimeError("Error building extension: c++: command not found\nmore detail")

    monkeypatch.delenv("TINYSTACK_QUANT_KERNEL", raising=False)
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    quant_kernels.extension.cache_clear()
    quant_kernels.default_path.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="c\\+\\+: command not found.*torch path") as caught:
            assert quant_kernels.default_path() == "torch"
        assert len(caught) == 1 and "more detail" not in str(caught[0].message)
        w, x = weights(10, 70), torch.randn(2, 70)
        p = quantize(w, "q4_1")  # the torch packer: same bytes as the C++ one
        assert torch.equal(p.qs, quantize_torch(w, "q4_1").qs)
        assert torch.allclose(kernels.matmul(x, p), x @ dequantize_numpy(p).T, atol=1e-6)
    finally:
        quant_kernels.extension.cache_clear()
        quant_kernels.default_path.cache_clear()


def test_concurrent_callers_and_many_small_tasks_give_exact_results():
    """The row pool (pool.h): helpers join or miss tasks at random moments, several Python threads call at
    once (the GIL is released inside); every result must equal the single-threaded one, bit for bit."""
    import threading

    if "avx512" not in PATHS and "cpp" not in PATHS:
        pytest.skip("no C++ extension on this machine: the pool is part of it")
    path = PATHS[0]
    p = quantize(weights(1000, 96), "q4_0")  # ~15 chunks of 64 rows: the pool splits it
    xs = [torch.randn(1 + i % 3, 96, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    threads_before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [kernels.matmul(x, p, path=path) for x in xs]  # no helpers: one thread does every chunk
        torch.set_num_threads(max(2, threads_before))
        errors = []

        def hammer(seed: int) -> None:
            for i in range(150):
                j = (seed + i) % len(xs)
                if not torch.equal(kernels.matmul(xs[j], p, path=path), want[j]):
                    errors.append((seed, i))

        workers = [threading.Thread(target=hammer, args=(s,)) for s in range(3)]
        for w in workers:
            w.start()
        hammer(99)
        for w in workers:
            w.join()
        assert errors == []
    finally:
        torch.set_num_threads(threads_before)


@pytest.mark.parametrize("path", PATHS)
def test_activations_the_kernels_do_not_take_run_the_reference_in_their_own_dtype(path):
    """The kernels take float32 CPU activations (kernels.KERNEL_TAKES); float64 ones are refused with the reason and
    multiplied by the dequantised weight in float64, on every path (the C++ would reject them)."""
    p = quantize(weights(24, 64), "q8_0")
    x = torch.randn(3, 64, dtype=torch.float64)
    assert "float64" in kernels.refusal(x, p) and kernels.refusal(x.float(), p) is None
    got = kernels.matmul(x, p, path=path)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, x @ dequantize(p, torch.float64).T)


class _ScaledLinear(torch.nn.Linear):
    """A linear layer subclass with an op quantize_model does not know (a scale after the product)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


@torch.no_grad()
def test_quantize_model_refuses_linear_subclasses_it_does_not_know():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), _ScaledLinear(64, 32))
    x = torch.randn(2, 64)
    want = model(x)
    report = quantize_model(model, "q8_0")
    assert report["layers"] == 1 and set(report["refused"]) == {"1"} and "_ScaledLinear" in report["refused"]["1"]
    assert isinstance(model[0], QuantLinear) and type(model[1]) is _ScaledLinear
    torch.testing.assert_close(model(x), want, rtol=0.05, atol=0.05)  # the scale kept: q8_0 rounding only
