"""Distributed data parallel setup, read from the environment `torchrun` provides.

`torchrun --nproc_per_node=N -m tinystack train ...` starts N processes with RANK,
WORLD_SIZE and LOCAL_RANK set; `init_distributed` joins them into one process group
(gloo on CPU, nccl on CUDA, one GPU per local rank). Without those variables it is a
no-op: world size 1, rank 0, so the same loop runs single-process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes logs, checkpoints and the model directory; the others only compute."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str) -> tuple[DistInfo, str]:
    """Join the process group if launched by torchrun; returns the info and the device this rank uses."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), device
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        device = f"cuda:{info.local_rank}"
        torch.cuda.set_device(device)
    return info, device


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def mean_across_ranks(value: float, info: DistInfo, device: str) -> float:
    """The mean of a scalar over all ranks (identity when not distributed); every rank gets the result."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return float(t.item()) / info.world_size


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
