"""What this CPU is, read in one place: its instruction flags and its identity, for the kernels' choices.

    flags()      -> the set of instruction flags Linux reports (/proc/cpuinfo's first `flags` line), empty elsewhere
    has_amx()    -> whether the CPU reports AMX BF16 (kernels/lora_amx.py builds and runs only then)
    identity()   -> "model name family model stepping flags:<hash> cores:<n>": the CPU as far as speed goes
                    (infer/quant/auto.py keys its measured format choice on it)

The quantised kernels' SIMD paths (kernels/quant/kernels.cpp) ask the compiled code instead
(`__builtin_cpu_supports`), because the same library must refuse an instruction set at run time wherever it is
loaded; kernels/quant's available_paths() reports that answer.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path

AMX_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields we use, from /proc/cpuinfo ({} where there is none: not Linux)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "cpu family", "model", "stepping", "flags") and key not in fields:
            fields[key] = value.strip()
    return fields


def flags() -> frozenset[str]:
    """The CPU's instruction flags as Linux names them (e.g. "avx2", "amx_bf16"); empty where unknown."""
    return frozenset(_cpuinfo().get("flags", "").split())


def has_amx() -> bool:
    """Whether the CPU reports AMX BF16 (elsewhere than Linux there is no AMX permission to ask for either)."""
    return all(f in flags() for f in AMX_FLAGS)


def identity() -> str:
    """The CPU as far as speed goes: model name, family/model/stepping, a hash of the flags, core count."""
    fields = dict(_cpuinfo())
    if not fields:
        fields["model name"] = platform.processor() or platform.machine()
    digest = hashlib.sha256(fields.pop("flags", "").encode()).hexdigest()[:8]
    return " ".join(fields.get(k, "?") for k in ("model name", "cpu family", "model", "stepping")) + \
        f" flags:{digest} cores:{os.cpu_count()}"
