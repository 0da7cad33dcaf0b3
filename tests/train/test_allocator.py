"""train/allocator.py: with freed memory kept, a step's large allocations stop page-faulting once the heap has grown.

Each case runs in a fresh interpreter (the setting is process-wide and cannot be undone): a "step" of three large
tensors (40, 64 and 100 MiB, every page written), then freed, twelve times; page faults counted per step
(getrusage's minor faults)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

STEPS = """
import json, resource, sys
import torch
if sys.argv[1] == "keep":
    from tinystack.train.allocator import keep_freed_memory
    assert keep_freed_memory() is True
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensors = [torch.ones(n << 20, dtype=torch.uint8) for n in (40, 64, 100)]
    del tensors
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""
PAGES = (40 + 64 + 100 << 20) // 4096


def _faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = _faults("default"), _faults("keep")
    # glibc's defaults: blocks this large are fresh mappings every step, every page faulted in again
    assert min(default[1:]) > PAGES // 2
    # kept: the first steps fault the heap in (it grows until the step's blocks fit), later steps reuse it
    assert kept[0] > PAGES // 2 and max(kept[-4:]) < PAGES // 100


def test_train_config_keeps_freed_memory_by_default():
    from tinystack.config import TrainConfig

    assert TrainConfig().keep_freed_memory is True
