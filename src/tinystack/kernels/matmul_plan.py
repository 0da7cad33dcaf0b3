"""How each training product runs fastest on this machine: measured the first time its shape is met, then kept.

PyTorch's CPU matmul (oneDNN) decides from a product's shape how to spread it over the threads, and for some
shapes it leaves threads idle: on a 2-core Xeon, [1024, K] @ [K, 576] in bf16 ran at one thread's speed, and the
same product as two row blocks, one library call per thread at once, ran far faster (BENCHMARKS.md). Which
shapes, and by how much, is the machine's and the library version's business, so nothing is assumed: the first
time a (shapes, strides, dtype, threads) is met, one library call and the row-split product (linear_ops.cpp,
rows_mm) are timed on the real operands, alternating, and the faster is kept for the process. A plan costs a few
products' time once per shape (a training step has about a dozen shapes); a split must win by SPLIT_MARGIN.

    linear_ops()     -> torch.ops.tinystack_linear (linear_ops.cpp: rows_mm, LoRA's product) or None
    row_parts(a, b)  -> 1 (one library call) or the thread count (rows split), planned as above
    mm(a, b)         -> a @ b the planned way
    plans()          -> {key: parts} planned so far in this process (for tests and benchmarks)
    fastest(ways)    -> the key of the fastest of several ways to do the same work, timed alternating (also
                        LoRA's choice of its fused AMX product, kernels/lora_amx.py)

Used by the training's linear layers (train/planned_linear.py) and LoRA's product (train/lora.py). One thread,
a non-CPU tensor, no C++ compiler, or a model under torch.compile (traced, not run): always one library call,
never timed.
"""
from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch

from tinystack.kernels.build import build

SPLIT_MARGIN = 0.9  # the split is kept only when its median time is below this fraction of one call's
ROUNDS = 5  # timed calls of each way, alternating, after WARMUP calls each (the library's first calls of a
WARMUP = 2  # shape create and cache its kernels)
MIN_ROWS_PER_PART = 64  # fewer rows per thread than this: one call, not worth timing

_plans: dict[tuple, int] = {}


@functools.lru_cache(maxsize=1)
def linear_ops():
    return build("tinystack_linear_ops", [Path(__file__).with_name("linear_ops.cpp")],
                 cflags=["-O3", "-fopenmp"], ldflags=["-fopenmp"], ops="tinystack_linear")


def row_parts(a: torch.Tensor, b: torch.Tensor) -> int:
    """How `a @ b` ([M, K] @ [K, N], one dtype) runs fastest here: 1 = one library call, T = a's rows split over
    the T threads (rows_mm). Planned on first sight of its shapes, strides, dtype and thread count."""
    threads = torch.get_num_threads()
    if threads < 2 or a.device.type != "cpu" or a.size(0) < threads * MIN_ROWS_PER_PART:
        return 1
    if torch.compiler.is_compiling():  # traced by torch.compile: nothing to time (fake tensors); its own kernels
        return 1
    key = (tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), a.dtype, threads)
    parts = _plans.get(key)
    if parts is None:
        ops = linear_ops()
        parts = _plans[key] = 1 if ops is None else _measure(a, b, threads, ops)
    return parts


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, as row_parts planned it."""
    parts = row_parts(a, b)
    return torch.mm(a, b) if parts == 1 else linear_ops().rows_mm(a, b, parts)


def plans() -> dict[tuple, int]:
    return dict(_plans)


@torch.no_grad()
def _measure(a: torch.Tensor, b: torch.Tensor, threads: int, ops) -> int:
    """One call or the split: the split must win by SPLIT_MARGIN."""
    return fastest({1: lambda: torch.mm(a, b), threads: lambda: ops.rows_mm(a, b, threads)}, SPLIT_MARGIN)


@torch.no_grad()
def fastest(ways: dict, margin: float = 1.0):
    """The key of the fastest of `ways` (callables doing the same work): each called WARMUP times, then ROUNDS
    times alternating (the machine's speed drifts; neighbours compare fairly), medians compared. The first way is
    the default: another is kept only when its median is below `margin` times the first's."""
    times: dict = {k: [] for k in ways}
    for _ in range(WARMUP):
        for way in ways.values():
            way()
    for _ in range(ROUNDS):
        for k, way in ways.items():
            t0 = time.perf_counter()
            way()
            times[k].append(time.perf_counter() - t0)
    medians = {k: statistics.median(v) for k, v in times.items()}
    first = next(iter(ways))
    best = min(medians, key=medians.get)
    return best if best == first or medians[best] < margin * medians[first] else first
