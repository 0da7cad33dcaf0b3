"""What every benchmark shares: where results go, the machine they ran on, and one way to time a call.

    RESULTS              benchmarks/results/ (JSON and PNG figures; BENCHMARKS.md quotes them)
    machine()            CPU model, cores, torch threads and version, Python, load average at start,
                         THP_MEM_ALLOC_ENABLE: every figure is recorded with the machine it came from
    finish(res)          adds the load average at the end (a figure measured under load does not count)
    timed(fn)            Timing(wall_s, cpu_s, value): wall time, and this process's CPU time, which
                         keeps ratios between systems meaningful when other jobs share the cores
    step_periods(...)    a training loop's steady-state step times from the clock readings at each step's start
    alternating(fns, rounds)  one call of each in turn, the order reversed every round: per-round seconds
                         (as each call measured itself) and speedups over an anchor
"""
from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def cpu_model() -> str:
    """/proc/cpuinfo's model name with family, model and cache size (a VM may show only "AMD EPYC")."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
        return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, "
                f"{info.get('cache size', '?')} cache)")
    except OSError:
        return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
                            "loadavg_at_start": os.getloadavg(),
                            # PyTorch's allocator asks for 2 MiB pages for every tensor when this is set
                            "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE")}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    except ImportError:
        pass
    return info


def finish(res: dict[str, Any]) -> dict[str, Any]:
    res.setdefault("machine", {})["loadavg_at_end"] = os.getloadavg()
    return res


class Timing(NamedTuple):
    wall_s: float
    cpu_s: float
    value: Any


def timed(fn: Callable[[], Any]) -> Timing:
    """Run fn once; its wall time, the CPU time of this process (all threads) and of the child processes it
    waited for (a CLI run as a subprocess), and its result."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    kids2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Timing(wall, cpu + (kids2.ru_utime - kids.ru_utime) + (kids2.ru_stime - kids.ru_stime), value)


def step_periods(starts: list[float], *, warmup: int, skip: Callable[[int], bool] = lambda step: False) -> list[float]:
    """Seconds of each whole step i (from its start to the next step's start: everything the loop does for it),
    for steps `warmup`.. that have a next start and are not `skip(i)` (e.g. the steps that also score val loss)."""
    return [b - a for i, (a, b) in enumerate(zip(starts, starts[1:])) if i >= warmup and not skip(i)]


def alternating(fns: dict[str, Callable[[], tuple[float, float]]], rounds: int, anchor: str) -> dict[str, Any]:
    """Call every fn once in turn for `rounds` rounds (after one untimed call each), the order reversed each round,
    so a machine whose speed drifts from one second to the next slows every fn of a round alike. Each fn returns
    the (wall, CPU) seconds of its call as measured where it ran (e.g. a worker process's own clocks). Returns per
    name each round's seconds and their medians, and each round's time of `anchor` over this fn's (> 1: this one
    is faster) with the median of those ratios: the figure that drift disturbs least."""
    for fn in fns.values():
        fn()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(fns[name]())
    out = {}
    for name, t in times.items():
        row: dict[str, Any] = {}
        for i, clock in enumerate(("wall", "cpu")):
            mine = [x[i] for x in t]
            ratios = [a[i] / b for a, b in zip(times[anchor], mine)]
            row |= {f"{clock}_s": mine, f"median_{clock}_s": statistics.median(mine),
                    f"speedup_per_round_{clock}": ratios, f"median_speedup_{clock}": statistics.median(ratios)}
        out[name] = row
    return out
