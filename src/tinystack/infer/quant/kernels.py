"""The matmul y = x @ W^T (+ b) for a packed weight, on the fastest path this machine has.

    matmul(x [M, K] float32, packed, bias=None, path=None) -> y [M, N] float32

Paths (tinystack.kernels.quant builds the C++ extension and picks one once per process; `path` overrides it per
call, which the tests use):
    "avx512"  the C++ kernels' AVX-512 VNNI code, where the CPU has it
    "avx2"    their AVX2 + FMA code, where the CPU has that but not AVX-512 VNNI (AMD Zen 2/3, older Intel)
    "cpp"     the same C++ extension's plain C++ loops (other CPUs)
    "torch"   dequantise the weight and call F.linear: where the extension cannot be built
              (no compiler), with a one-line warning
The C++ paths quantise activations to int8 per block of 32 (as llama.cpp does), so they differ from the
dequantised float product by that rounding; the torch path multiplies in float.
From `GEMM_MIN_ROWS` rows on (long prefill chunks) every path dequantises the weight once and calls the
float32 GEMM, which is compute-bound there; below it the kernels, reading each weight once for all rows,
are faster. Inside `with decode_arithmetic():` every row count goes through the kernels, so a long sequence
is scored with exactly the arithmetic decode uses (weight_format="auto" measures quality that way).
What the kernels take is data (KERNEL_TAKES): float32 activations on the CPU, a weight in one of the formats they
were written for; anything else is refused (`refusal` names why) and runs the reference torch path.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F

from tinystack.infer.quant.formats import BLOCK_FORMATS, FORMATS, Packed, dequantize
from tinystack.kernels.quant import PATH_CODES, default_path, extension

GEMM_MIN_ROWS = 128  # from here on dequantise + float32 GEMM (crossover: BENCHMARKS.md, "Weight formats")
_KERNELS_FOR_ALL_ROWS = contextvars.ContextVar("kernels_for_all_rows", default=False)
# What the C++ kernels (kernels/quant/kernels.cpp) were written for: anything else runs the torch reference
KERNEL_TAKES = {"formats": frozenset(FORMATS), "x_dtype": torch.float32, "device": "cpu"}


@contextlib.contextmanager
def decode_arithmetic():
    """Within this block the kernels serve every row count (no float32 GEMM for long inputs)."""
    token = _KERNELS_FOR_ALL_ROWS.set(True)
    try:
        yield
    finally:
        _KERNELS_FOR_ALL_ROWS.reset(token)


def refusal(x: torch.Tensor, p: Packed) -> str | None:
    """Why the C++ kernels cannot take x @ p (None: they can): see KERNEL_TAKES."""
    if x.device.type != KERNEL_TAKES["device"]:
        return f"activations on {x.device.type} (the kernels are CPU code)"
    if x.dtype != KERNEL_TAKES["x_dtype"]:
        return f"activations in {x.dtype} (the kernels take {KERNEL_TAKES['x_dtype']})"
    if p.fmt not in KERNEL_TAKES["formats"]:
        return f"weight format {p.fmt!r} is not one of {sorted(KERNEL_TAKES['formats'])}"
    return None


def matmul(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """x [M, K] float32 @ dequantize(p)^T (+ bias) -> [M, N] float32 (another x the kernels refuse: in x's dtype,
    through the torch reference)."""
    path = path or default_path()
    gemm = x.shape[0] >= GEMM_MIN_ROWS and not _KERNELS_FOR_ALL_ROWS.get()
    if path == "torch" or gemm or refusal(x, p) is not None:
        return F.linear(x, dequantize(p, x.dtype), bias)
    ext = extension()
    if ext is None:
        raise RuntimeError(f"the {path!r} kernel path needs the C++ extension, which could not be built")
    code = PATH_CODES[path]
    x = x.contiguous()
    if p.fmt == "bf16":
        return ext.bf16_matmul(x, p.qs, bias, code)
    return ext.block_matmul(x, BLOCK_FORMATS[p.fmt], p.qs, p.d, p.m, bias, code)
