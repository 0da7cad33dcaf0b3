"""Write a float32 safetensors file one tensor at a time, so peak memory is one tensor, not the model.

`safetensors.torch.save_file` needs every tensor in memory at once: for an imported GGUF that
is the whole dequantised float32 model (4x a Q8 file, 8x a Q4 one). The format allows
streaming, because the header only needs names, dtypes and shapes, which GGUF's tensor index
gives before any data is read:

    u64 little-endian N | N bytes of JSON header, space-padded to a multiple of 8 | tensor bytes
    header: {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}}

Offsets are relative to the first byte after the header; tensors are laid back to back in the
order given. Read back with `safetensors` (the library is the reference in the tests).
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np


def write_streaming(path: str | Path, shapes: Sequence[tuple[str, tuple[int, ...]]],
                    tensors: Iterable[tuple[str, np.ndarray]], metadata: dict[str, str] | None = None) -> None:
    """`shapes` [(name, shape)] fixes the header and the order; `tensors` must then yield exactly those
    names with those shapes, in that order (any float dtype, written as little-endian float32)."""
    header: dict[str, object] = {"__metadata__": metadata or {}}
    offset = 0
    for name, shape in shapes:
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        expected = iter(shapes)
        for name, arr in tensors:
            want = next(expected, None)
            if want is None or want[0] != name or tuple(arr.shape) != tuple(want[1]):
                raise ValueError(f"tensor {name} {tuple(arr.shape)} does not match the header's next entry {want}")
            f.write(memoryview(np.ascontiguousarray(arr, dtype="<f4")).cast("B"))
        if next(expected, None) is not None:
            raise ValueError("fewer tensors than the header lists")
