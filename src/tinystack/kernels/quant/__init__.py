"""The quantised-weight kernels' C++ extension (kernels.cpp, pack.cpp, fused_step.cpp) and the choice of its path.

    extension()         -> the compiled module (pybind11), or None (one warning) where it cannot be built
    default_path()      -> "avx512" | "avx2" | "cpp" | "torch": the fastest that runs here, once per process
                           (TINYSTACK_QUANT_KERNEL=avx512|avx2|cpp|torch forces one)
    available_paths()   -> the paths that run here, fastest first (the tests cover each)
    PATH_CODES          -> the C++ `path` argument of each path

    kernels.cpp         y = x @ W^T for packed W: AVX-512 VNNI int8 dot products with activations quantised per
                        block of 32 (bf16: fp32 FMAs), plain C++ twins; output rows shared between torch's threads
                        so that a late thread never delays the caller (pool.h); the AVX-512 and AVX2 paths in
                        kernels_avx512.h / kernels_avx2.h (one translation unit)
    pack.cpp            the packer and dequantiser (llama.cpp's rounding)
    fused_step.cpp      every layer of a Llama-family decode step in one call (infer/fused_step.py decides when)

Compiled at first use with -O3 (the AVX-512 functions carry their own target attributes, as do the AVX2 ones, so
the library runs on any x86-64 and the path is chosen at run time by `__builtin_cpu_supports`).
What the packed weights mean and when the kernels serve a product is infer/quant's business (formats.py,
kernels.py); this package only builds and loads.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from tinystack.kernels.build import build

PATHS = ("avx512", "avx2", "cpp", "torch")
PATH_CODES = {"cpp": 0, "avx512": 1, "avx2": 2}  # kernels.cpp's `path` argument
_HERE = Path(__file__).parent
_SOURCES = [_HERE / f for f in ("kernels.cpp", "pack.cpp", "fused_step.cpp")]
_HEADERS = [_HERE / f for f in ("kernels.h", "kernels_avx512.h", "kernels_avx2.h", "pool.h")]


@functools.lru_cache(maxsize=1)
def extension():
    """The compiled C++ module, or None (with one warning) where it cannot be built."""
    # -ffp-contract=off: no fused multiply-adds in the packer, whose rounding must match llama.cpp's
    return build("tinystack_quant_kernels", _SOURCES, _HEADERS,
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
