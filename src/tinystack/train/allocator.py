"""Keep the memory a training step frees for the next step, instead of handing it back to the OS each time.

A training step allocates and frees the same activations, logits and gradients every time. glibc's malloc (what
PyTorch's CPU allocator calls) serves an allocation over its mmap threshold (at most 32 MiB) with a fresh mapping
and unmaps it on free, and trims the top of its heap once more than the trim threshold lies free: so the next step
meets those pages again as new memory, one page fault per 4 KiB (hundreds of thousands a SmolLM2 full
fine-tuning step). With mappings off and the trim threshold out of reach, freed
memory stays in the process and is reused: the process keeps its peak (which every step reaches again anyway).
The same advice Intel gives for PyTorch CPU training (jemalloc or tcmalloc in LD_PRELOAD), without a second
allocator: two `mallopt` calls.

    keep_freed_memory() -> True once glibc's malloc is set so (process-wide, for the rest of the process);
                           False, changing nothing, where the C library is not glibc (macOS, musl)

`train.loop.train_model` calls it when `[train] keep_freed_memory` is true (the default). `tinystack serve` never
does; the main job's short demo server, which runs after training in the same process, keeps the setting.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD = 1 << 30  # only trim when a whole GiB lies free at the heap's top (e.g. after the model is gone)


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library by that name, or one without mallopt: not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting M_MMAP_MAX also stops glibc's threshold from adapting
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
