"""Torch intra-op threads for evaluation.

Evaluation runs many small matrix products (batches of a few short windows, one-token
decode steps). On a machine whose cores are shared with other jobs, torch's default
of one thread per core makes each product wait for all its threads to be scheduled, and
one thread can then be many times faster (an idle machine is fastest with torch's own
count). `[eval] threads` (default 0 = torch's own; set 1 on shared cores) sets the count
for the duration of an evaluation and restores the previous value afterwards.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Use n intra-op threads inside the block (n <= 0: leave torch's setting alone)."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
