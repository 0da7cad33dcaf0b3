"""The matmul y = x @ W^T (+ b) for a packed weight, on the fastest path this machine has.

    matmul(x [M, K] float32, packed, bias=None, path=None) -> y [M, N] float32

Paths, chosen once per process (or per call with `path`, which the tests use):
    "avx512"  the C++ kernels' AVX-512 VNNI code (kernels.cpp), where the CPU has it
    "avx2"    their AVX2 + FMA code, where the CPU has that but not AVX-512 VNNI (AMD Zen 2/3, older Intel)
    "cpp"     the same C++ extension's plain C++ loops (other CPUs)
    "torch"   dequantise the weight and call F.linear: where the extension cannot be built
              (no compiler), with a one-line warning
The environment variable TINYSTACK_QUANT_KERNEL=avx512|avx2|cpp|torch forces one.

The extension (kernels.cpp, pack.cpp) is compiled at first use with -O3 (the AVX-512 functions carry their own
target attributes, as do the AVX2 ones, so the library runs on any x86-64 and the path is chosen at run time by
`__builtin_cpu_supports`), cached by torch under ~/.cache/torch_extensions (one build per version of
the sources). The C++ paths quantise activations to int8 per block of 32 (as llama.cpp does), so they differ from the
dequantised float product by that rounding; the torch path multiplies in float.
From `GEMM_MIN_ROWS` rows on (long prefill chunks) every path dequantises the weight once and calls the
float32 GEMM, which is compute-bound there; below it the kernels, reading each weight once for all rows,
are faster. Inside `with decode_arithmetic():` every row count goes through the kernels, so a long sequence
is scored with exactly the arithmetic decode uses (dtype="auto" measures quality that way).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from tinystack import native
from tinystack.infer.quant.formats import BLOCK_FORMATS, Packed, dequantize

PATHS = ("avx512", "avx2", "cpp", "torch")
PATH_CODES = {"cpp": 0, "avx512": 1, "avx2": 2}  # kernels.cpp's `path` argument
GEMM_MIN_ROWS = 128  # from here on dequantise + float32 GEMM (crossover measured: BENCHMARKS.md, "Weight formats")
_KERNELS_FOR_ALL_ROWS = contextvars.ContextVar("kernels_for_all_rows", default=False)
_SOURCES = [Path(__file__).with_name(f) for f in ("kernels.cpp", "pack.cpp", "fused_step.cpp")]
_HEADERS = [Path(__file__).with_name(f) for f in ("kernels.h", "kernels_avx512.h", "kernels_avx2.h", "pool.h")]


@functools.lru_cache(maxsize=1)
def extension():
    """The compiled C++ module, or None (with one warning) where it cannot be built."""
    # -ffp-contract=off: no fused multiply-adds in the packer, whose rounding must match llama.cpp's
    return native.build("tinystack_quant_kernels", _SOURCES, _HEADERS,
                        cflags=["-O3", "-fopenmp", "-ffp-contract=off"], ldflags=["-fopenmp"])


@functools.lru_cache(maxsize=1)
def default_path() -> str:
    forced = os.environ.get("TINYSTACK_QUANT_KERNEL", "")
    if forced:
        if forced not in PATHS:
            raise ValueError(f"TINYSTACK_QUANT_KERNEL must be one of {PATHS}, got {forced!r}")
        return forced
    ext = extension() if sys.platform.startswith("linux") or sys.platform == "darwin" else None
    if ext is None:
        return "torch"
    return available_paths()[0]


def available_paths() -> list[str]:
    """The paths that can run here, fastest first (the tests cover each)."""
    ext = extension()
    if ext is None:
        return ["torch"]
    simd = [("avx512", ext.avx512_available()), ("avx2", ext.avx2_available())]
    return [path for path, ok in simd if ok] + ["cpp", "torch"]


@contextlib.contextmanager
def decode_arithmetic():
    """Within this block the kernels serve every row count (no float32 GEMM for long inputs)."""
    token = _KERNELS_FOR_ALL_ROWS.set(True)
    try:
        yield
    finally:
        _KERNELS_FOR_ALL_ROWS.reset(token)


def matmul(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """x [M, K] float32 @ dequantize(p)^T (+ bias) -> [M, N] float32."""
    path = path or default_path()
    gemm = x.shape[0] >= GEMM_MIN_ROWS and not _KERNELS_FOR_ALL_ROWS.get()
    if path == "torch" or gemm or x.device.type != "cpu":  # the C++ kernels are CPU code
        return F.linear(x, dequantize(p, x.dtype), bias)
    ext = extension()
    if ext is None:
        raise RuntimeError(f"the {path!r} kernel path needs the C++ extension, which could not be built")
    code = PATH_CODES[path]
    x = x.contiguous()
    if p.fmt == "bf16":
        return ext.bf16_matmul(x, p.qs, bias, code)
    return ext.block_matmul(x, BLOCK_FORMATS[p.fmt], p.qs, p.d, p.m, bias, code)
