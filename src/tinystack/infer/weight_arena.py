"""Where the engine's big tensors live in memory: one arena of 2 MiB pages, and the head stored column-major.

Why: a batch-1 decode step streams every weight once (GPT-2-124M: 498 MB per token) and
does ~2 flops per byte, so its speed is the speed of reading memory. With ordinary 4 KiB
pages that stream needs a new TLB entry every 4 KiB, 120,000 page walks per token; in a
virtual machine each walk is two-dimensional and competes with the other tenants for the
cache, so the same matrix-vector products run markedly slower from 4 KiB pages and swing
with the neighbours' load (figures: BENCHMARKS.md, benchmarks/bench_hugepages.py).

Linux hands out 2 MiB ("transparent huge") pages to anonymous memory that asks for them
with madvise(MADV_HUGEPAGE) when /sys/kernel/mm/transparent_hugepage/enabled is
`madvise` or `always`; PyTorch's allocator does not ask. So:

    hugepage_empty(nbytes)  -> a zero-filled uint8 tensor on an mmap'd, 2 MiB-aligned, madvised region
                               (ordinary memory where the OS has no such pages: same values, just slower)
    populate(t, nbytes)     -> the pages under t's first nbytes faulted in now, contents unchanged
                               (MADV_POPULATE_WRITE); False where the OS cannot
    place_weights(model)    -> every CPU parameter and buffer copied into one such arena (ties kept:
                               a Parameter shared by two modules is moved once), the output head's
                               weight stored transposed ("column-major", see below); returns a report

Column-major head: at batch 1 the head is a vector-matrix product over the largest matrix
(50257 x 768, 154 MB), and `x @ W.T` runs faster when W.T is the contiguous one (the
kernel then streams rows of W.T scaled by x's entries into one accumulator). A tied token
embedding shares that storage, so its row lookups become strided, which costs nothing
measurable (one row per token). The other linear layers stay row-major: for them the two
layouts decode equally fast, and row-major prefills (compute-bound matrix products) faster.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
_ALIGN = 64  # every tensor starts on a cache line
MADV_POPULATE_WRITE = 23  # Linux >= 5.14 (asm-generic/mman-common.h); Python's mmap module does not name it


def hugepages_available() -> bool:
    """True when anonymous memory can ask Linux for transparent 2 MiB pages."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return hasattr(mmap, "MADV_HUGEPAGE") and ("[madvise]" in mode or "[always]" in mode)


def hugepage_empty(nbytes: int, hugepages: bool = True) -> torch.Tensor:
    """A zero-filled uint8 CPU tensor of nbytes whose memory is backed by 2 MiB pages where the OS allows
    (`hugepages` False: a region of its own that asks for 4 KiB pages (MADV_NOHUGEPAGE), the control for
    comparisons; malloc'd memory could share a mapping that something else had madvised).

    The region is mapped lazily: pages are only allocated (and zeroed by the kernel) when first
    touched, so a KV cache sized for the whole budget costs what it holds, not what it could."""
    if nbytes <= 0:
        return torch.zeros(0, dtype=torch.uint8)
    if nbytes < HUGE_PAGE or not hugepages_available():  # below one page there is nothing to gain
        return torch.zeros(nbytes, dtype=torch.uint8)
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to align the start to a page
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE if hugepages else mmap.MADV_NOHUGEPAGE)
    buf = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive as long as any view of it
    start = -buf.data_ptr() % HUGE_PAGE
    return buf[start: start + nbytes]


@functools.lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):  # the advice number is Linux's; elsewhere it means something else
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # no C library with madvise (not a POSIX system)
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def populate(t: torch.Tensor, nbytes: int) -> bool:
    """Fault in the pages under the first `nbytes` of CPU tensor `t` now, writable, as a first write to each would,
    without changing what they hold: so a later first write does not wait for the OS to find and zero a page.
    Safe while other threads read and write the memory. False (nothing done) where the OS cannot: not Linux,
    a kernel before 5.14, or memory that is not anonymous or file-backed private memory."""
    madvise = _madvise()
    if madvise is None or nbytes <= 0 or t.device.type != "cpu":
        return False
    start = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE  # madvise wants a page-aligned start
    return madvise(start, t.data_ptr() + nbytes - start, MADV_POPULATE_WRITE) == 0


@dataclass
class ArenaReport:
    tensors: int  # parameters and buffers moved
    nbytes: int  # bytes in the arena
    hugepages: bool  # whether the OS backs the arena with 2 MiB pages
    column_major_head: bool

    def __str__(self) -> str:
        pages = "2 MiB pages" if self.hugepages else "ordinary 4 KiB pages"
        head = ", output head column-major" if self.column_major_head else ""
        return f"weights: {self.tensors} tensors, {self.nbytes / 2**20:,.1f} MiB in one arena of {pages}{head}"


def _head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    head = getattr(model, "lm_head", None)
    w = getattr(head, "weight", None) if isinstance(head, torch.nn.Linear) else None
    return w if w is not None and w.dim() == 2 else None


def place_weights(model: torch.nn.Module, hugepages: bool = True) -> ArenaReport | None:
    """Move every CPU parameter and buffer of `model` into one huge-page arena, the head column-major.

    Values are unchanged (copies); Parameter objects keep their identity, so tied weights stay
    tied and optimisers or hooks holding them still see them. `hugepages=False` keeps ordinary
    pages (for comparisons). Returns None, doing nothing, for a model that is not a torch module,
    not on the CPU, or placed already (a model is placed once, by the first engine given it)."""
    if not isinstance(model, torch.nn.Module):  # e.g. the NumPy backend: its arrays are its own
        return None
    tensors = list(model.parameters()) + list(model.buffers())  # both deduplicate shared tensors
    if not tensors or any(t.device.type != "cpu" for t in tensors) or getattr(model, "_weight_arena", None) is not None:
        return None
    head = _head_weight(model)
    offsets, total = [], 0
    for t in tensors:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += t.numel() * t.element_size()
    arena = hugepage_empty(total, hugepages)
    with torch.no_grad():
        for t, off in zip(tensors, offsets):
            flat = arena[off: off + t.numel() * t.element_size()].view(t.dtype)
            if t is head:  # stored as W.T [C, V] contiguous, seen as W [V, C] (a transposed view)
                placed = flat.view(t.shape[1], t.shape[0]).t()
            else:
                placed = flat.view(t.shape)
            placed.copy_(t)
            t.data = placed  # the old storage is freed once nothing else holds it
    model._weight_arena = arena  # a plain attribute, not a buffer: it does not appear in state_dict
    huge = hugepages and total >= HUGE_PAGE and hugepages_available()
    return ArenaReport(len(tensors), total, huge, head is not None)
