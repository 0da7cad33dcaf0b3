"""What every benchmark shares: where results go, the machine they ran on, and one way to time a call.

    RESULTS              benchmarks/results/ (JSON and PNG figures; BENCHMARKS.md quotes them)
    machine()            CPU model, cores, torch threads and version, Python, load average at start,
                         THP_MEM_ALLOC_ENABLE: every figure is recorded with the machine it came from
    finish(res)          adds the load average at the end (a figure measured under load does not count)
    timed(fn)            Timing(wall_s, cpu_s, value): wall time, and this process's CPU time, which
                         keeps ratios between systems meaningful when other jobs share the cores
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
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
    """Run fn once; its wall time, this process's CPU time (all threads) and its result."""
    w0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    return Timing(time.perf_counter() - w0, time.process_time() - c0, value)
