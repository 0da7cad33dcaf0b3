"""Mixed precision: which autocast context and gradient scaler a `[train] dtype` means, and `auto`.

    float32   no autocast
    float64   the model is cast to float64, no autocast (for exact comparisons with the NumPy backend)
    bfloat16  autocast to bf16 on CPU or CUDA; bf16 has float32's exponent range, so no scaler
    float16   autocast to fp16, CUDA only, with a GradScaler (fp16 gradients underflow without one)
    auto      measured at the start of training (`pick_by_measurement`): a few forward/backward passes
              of float32 and of bf16 autocast on one batch, interleaved; bf16 wins only when it is
              clearly faster on this machine AND its loss agrees with float32's. Whether bf16 pays
              depends on the hardware (AMX / AVX-512-bf16 CPUs, tensor cores) and on the matrix sizes,
              so it is never assumed. First a screen: one of the model's own linear products, timed in
              each dtype (milliseconds); a candidate whose product runs over SCREEN_SLOWER times the
              reference's is dropped before any whole pass. Where the CPU has no bf16 instructions
              (an AVX2-only AMD EPYC: bf16 matmul far slower than float32) a single bf16 pass of a
              135M-parameter model would otherwise take minutes, and the probe runs six of them.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, ContextManager

import torch

DTYPES = ("float32", "float64", "bfloat16", "float16", "auto")
AUTO_CANDIDATES = ("float32", "bfloat16")
MIN_SPEEDUP = 1.05  # bf16 must be at least this much faster: below it, timing noise would flip the choice
LOSS_RTOL = 0.01  # bf16's probe loss within 1% of float32's (both on the same batch and weights)
# a candidate whose screen product takes this many times the reference's cannot win by MIN_SPEEDUP on a model
# whose time is mostly such products: it is dropped without whole passes
SCREEN_SLOWER = 2.0
SCREEN_ROUNDS = 3
SCREEN_ROWS = 128  # rows of the screen's input: a slice of a batch's tokens


def check_dtype(name: str, device_type: str) -> None:
    if name not in DTYPES:
        raise ValueError(f"train.dtype must be one of {DTYPES}, got {name!r}")
    if name == "float16" and device_type != "cuda":
        raise ValueError("train.dtype='float16' needs CUDA (it relies on a GradScaler); use 'bfloat16' on CPU")


def autocast(name: str, device_type: str) -> ContextManager[object]:
    """The forward-pass context for this dtype (a no-op for float32/float64)."""
    if name in ("bfloat16", "float16"):
        return torch.autocast(device_type=device_type, dtype=getattr(torch, name))
    return contextlib.nullcontext()


def grad_scaler(name: str, device_type: str) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for float16 (disabled, its methods pass straight through)."""
    return torch.amp.GradScaler(device_type, enabled=(name == "float16"))


def pick_by_measurement(run_step: Callable[[str], float], candidates: Sequence[str] = AUTO_CANDIDATES,
                        rounds: int = 5, screen: Callable[[str], object] | None = None) -> tuple[str, dict[str, Any]]:
    """Resolve `auto`: time `run_step(dtype)` (one forward/backward, returning its loss) for each candidate,
    interleaved over `rounds` after one warm-up each, and return (chosen dtype, the record of why).

    The first candidate is the reference (float32): another wins only if its median time is at least
    MIN_SPEEDUP faster and its loss is within LOSS_RTOL of the reference's. A candidate that raises
    (no bf16 on this device) is dropped. Interleaving keeps the comparison fair on a shared machine.
    `screen(dtype)`, when given, is a cheap representative piece of the step (one product): timed first,
    interleaved, and a candidate over SCREEN_SLOWER times the reference's is dropped (record["screened_out"]:
    its time over the reference's) without running a step."""
    t_start = time.perf_counter()
    errors: dict[str, str] = {}
    ref = candidates[0]
    screened: dict[str, float] = {}
    if screen is not None:
        _, screen_s = _interleaved(screen, candidates, SCREEN_ROUNDS, errors)
        if ref in screen_s:
            slower = {c: t / max(screen_s[ref], 1e-9) for c, t in screen_s.items() if c != ref}
            screened = {c: round(r, 2) for c, r in slower.items() if r > SCREEN_SLOWER}
    first, step_s = _interleaved(run_step, [c for c in candidates if c not in screened and c not in errors],
                                 rounds, errors)
    if ref not in step_s:
        raise RuntimeError(f"train.dtype=auto: the reference {ref} step failed: {errors[ref]}")
    losses = {c: float(v) for c, v in first.items()}
    median_ms = {c: t * 1e3 for c, t in step_s.items()}
    agree = {c: abs(losses[c] - losses[ref]) <= LOSS_RTOL * abs(losses[ref]) for c in median_ms}
    chosen = ref
    for c in median_ms:
        if agree[c] and median_ms[ref] / median_ms[c] >= MIN_SPEEDUP and median_ms[c] < median_ms[chosen]:
            chosen = c
    record = {"chosen": chosen, "ms_per_step": {c: round(v, 2) for c, v in median_ms.items()},
              "loss": {c: round(v, 5) for c, v in losses.items()}, "loss_agrees": agree, "rounds": rounds,
              "speedup": round(median_ms[ref] / median_ms[chosen], 3),
              "probe_s": round(time.perf_counter() - t_start, 3), **({"failed": errors} if errors else {}),
              **({"screened_out": screened} if screened else {})}
    return chosen, record


def _interleaved(fn: Callable[[str], object], candidates: Sequence[str], rounds: int,
                 errors: dict[str, str]) -> tuple[dict[str, object], dict[str, float]]:
    """One untimed warm-up call of `fn(c)` per candidate (first-call allocations and kernel selection; one that
    raises goes to `errors` and is dropped), then `rounds` timed calls, the candidates interleaved
    -> ({candidate: its warm-up call's result}, {candidate: median seconds}), in the candidates' order."""
    first: dict[str, object] = {}
    for c in candidates:
        try:
            first[c] = fn(c)
        except (RuntimeError, TypeError) as e:
            errors[c] = f"{type(e).__name__}: {e}"[:200]
    times: dict[str, list[float]] = {c: [] for c in first}
    for _ in range(rounds):
        for c in times:
            t0 = time.perf_counter()
            fn(c)
            times[c].append(time.perf_counter() - t0)
    return first, {c: statistics.median(t) for c, t in times.items()}


def describe(record: dict[str, Any]) -> str:
    """One line for the console: the choice and the measurements behind it."""
    ms = ", ".join(f"{c} {v:.1f} ms" for c, v in record["ms_per_step"].items())
    loss = ", ".join(f"{c} {v:.4f}" for c, v in record["loss"].items())
    out = "".join(f"; {c} dropped: its linear product took {r:g}x float32's"
                  for c, r in record.get("screened_out", {}).items())
    return f"precision auto -> {record['chosen']} (forward+backward {ms}; probe loss {loss}{out})"


def probe(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
          loss_fn: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
          rounds: int = 5) -> tuple[str, dict[str, Any]]:
    """`pick_by_measurement` on real forward/backward passes of `model` over the batch x -> y. Leaves no trace:
    the gradients are dropped after each pass, no weight changes and the RNG state (dropout) is restored."""
    device_type = x.device.type

    def run_step(dtype: str) -> float:
        with autocast(dtype, device_type):
            loss = loss_fn(model, x, y)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())

    with torch.random.fork_rng(devices=[x.device] if device_type == "cuda" else []):
        return pick_by_measurement(run_step, rounds=rounds, screen=_linear_screen(model, x.numel(), device_type))


def _linear_screen(model: torch.nn.Module, tokens: int, device_type: str) -> Callable[[str], object] | None:
    """The screen for `pick_by_measurement`: one of the model's own linear products (the weight of median size,
    so neither the output head nor a tiny layer) over min(tokens, SCREEN_ROWS) rows, under the dtype's autocast.
    None for a model without linear layers."""
    weights = sorted((m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)), key=lambda w: w.numel())
    if not weights:
        return None
    w = weights[len(weights) // 2].detach()
    x = torch.randn(min(tokens, SCREEN_ROWS), w.shape[1], device=w.device, dtype=w.dtype)

    def product(dtype: str) -> object:
        with torch.no_grad(), autocast(dtype, device_type):
            y = torch.nn.functional.linear(x, w)
        if device_type == "cuda":
            torch.cuda.synchronize()
        return y
    return product
