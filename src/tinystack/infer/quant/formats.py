"""Weight formats: quantise a float matrix [N, K] into blocks, dequantise it back, and GGUF's byte layout.

    format  bytes/weight  per block of 32 weights along K            w =
    bf16    2             (no blocks: bfloat16, K zero-padded to 32)  w
    q8_0    34/32         d fp16, qs int8[32]                         d * q
    q4_0    18/32         d fp16, qs uint8[16] (2 nibbles each)       d * (q - 8)
    q4_1    20/32         d fp16, m fp16, qs uint8[16]                d * q + m

The block formats are llama.cpp's (ggml-quants.c `quantize_row_*_ref`), bit for bit: the same
scale choice (Q4_0's d = the signed value of largest magnitude / -8, Q4_1's d = (max - min) / 15
with m = min, Q8_0's d = max|w| / 127, all computed in float32 and stored as fp16), the same
rounding (Q8_0 rounds half away from zero, the Q4s truncate x + 0.5), and the same nibble order
(byte i of a Q4 block holds element i in its low nibble and element i + 16 in its high one).
In memory the fields are kept as separate arrays (`Packed.qs` [N, nb, 32 | 16], `.d`, `.m`
[N, nb]) so the kernels load 4 blocks of quants with one aligned vector load; `to_gguf` /
`from_gguf` convert to and from the interleaved GGUF block bytes without re-quantising, so a
GGUF file's Q8_0 / Q4_0 / Q4_1 tensors can be used as they are.
K not a multiple of 32 is zero-padded (a zero block quantises to d = 0 and dequantises to 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tinystack.kernels import quant as quant_kernels
from tinystack.model.gguf_dequant import dequantize as gguf_dequantize

BLOCK = 32
FORMATS = ("bf16", "q8_0", "q4_0", "q4_1")
BLOCK_FORMATS = {"q8_0": 0, "q4_0": 1, "q4_1": 2}  # the kernel's format codes
GGUF_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
GGML_TYPES = {"q8_0": 8, "q4_0": 2, "q4_1": 3}  # ggml's type ids


@dataclass
class Packed:
    """One quantised weight matrix. `qs` is the raw data (bf16: the padded weight itself)."""

    fmt: str
    in_features: int
    qs: torch.Tensor
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return self.qs.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)


def _padded_blocks(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> float32 [N, nb, 32], zero-padded along K."""
    n, k = w.shape
    w = w.detach().to(torch.float32)
    pad = -k % BLOCK
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(n, -1, BLOCK)


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero), computed as gguf/ggml do so results match bit for bit."""
    a = v.abs()
    f = a.floor()
    return torch.sign(v) * (f + torch.floor(2 * (a - f)))


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [..., 32] in 0..15 -> [..., 16]: element i low nibble, element i + 16 high nibble."""
    return q[..., :16] | (q[..., 16:] << 4)


def _extension():
    return quant_kernels.extension() if quant_kernels.default_path() != "torch" else None


def quantize(w: torch.Tensor, fmt: str) -> Packed:
    """Pack a float [N, K] weight into `fmt` (one of FORMATS); the C++ extension's packer where it is built
    (one pass, both cores), else the torch code below: identical bytes."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    if fmt == "bf16":
        return Packed(fmt, k, _padded_blocks(w).reshape(n, -1).to(torch.bfloat16).contiguous())
    ext = _extension() if fmt in BLOCK_FORMATS and w.device.type == "cpu" else None
    if ext is not None:
        qs, d, m = ext.block_quantize(w.detach().to(torch.float32).contiguous(), BLOCK_FORMATS[fmt])
        return Packed(fmt, k, qs, d, m if fmt == "q4_1" else None)
    return quantize_torch(w, fmt)


def quantize_torch(w: torch.Tensor, fmt: str) -> Packed:
    """quantize() in torch operations: the fallback, and the tests' second implementation."""
    n, k = w.shape
    blocks = _padded_blocks(w)
    if fmt == "q8_0":
        d = blocks.abs().amax(-1) / 127
        q = _roundf(blocks * _inverse(d)[..., None]).to(torch.int8)
        return Packed(fmt, k, q.view(torch.uint8).contiguous(), d.to(torch.float16))
    if fmt == "q4_0":
        idx = blocks.abs().argmax(-1, keepdim=True)  # the first of equal magnitudes, as ggml's loop
        d = torch.gather(blocks, -1, idx).squeeze(-1) / -8
        q = torch.trunc(blocks * _inverse(d)[..., None] + 8.5).clamp(0, 15).to(torch.uint8)
        return Packed(fmt, k, _pack_nibbles(q).contiguous(), d.to(torch.float16))
    if fmt == "q4_1":
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        d = (hi - lo) / 15
        q = torch.trunc((blocks - lo[..., None]) * _inverse(d)[..., None] + 0.5).clamp(0, 15).to(torch.uint8)
        return Packed(fmt, k, _pack_nibbles(q).contiguous(), d.to(torch.float16), lo.to(torch.float16))
    raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}")


def dequantize(p: Packed, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float [N, K] matrix the packed weight stands for (what the kernels multiply by)."""
    if p.fmt == "bf16":
        return p.qs[:, :p.in_features].to(dtype)
    ext = _extension() if p.fmt in BLOCK_FORMATS and p.qs.device.type == "cpu" else None
    if ext is not None:
        return ext.block_dequantize(BLOCK_FORMATS[p.fmt], p.qs, p.d, p.m, p.in_features).to(dtype)
    return dequantize_numpy(p, dtype)


def dequantize_numpy(p: Packed, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """dequantize() without the extension: the GGUF blocks through the model importer's NumPy dequantiser
    (tinystack.model.gguf_dequant, bit-identical to ggml's)."""

    blocks = to_gguf(p).cpu().numpy()
    w = gguf_dequantize(blocks, GGML_TYPES[p.fmt], (p.out_features, blocks.shape[1] // GGUF_BLOCK_BYTES[p.fmt] * BLOCK))
    return torch.from_numpy(w[:, :p.in_features]).to(device=p.qs.device, dtype=dtype)


def to_gguf(p: Packed) -> torch.Tensor:
    """The GGUF tensor data: uint8 [N, nb * block bytes], blocks of (d[, m], qs) in row order."""
    if p.fmt not in GGUF_BLOCK_BYTES:
        raise ValueError(f"{p.fmt} has no GGUF block layout")
    fields = [p.d[..., None].view(torch.uint8)]
    if p.m is not None:
        fields.append(p.m[..., None].view(torch.uint8))
    return torch.cat(fields + [p.qs], dim=-1).reshape(p.out_features, -1)


def from_gguf(data: torch.Tensor, fmt: str, in_features: int) -> Packed:
    """GGUF tensor data (uint8, [N, nb * block bytes] or flat) of an [N, in_features] weight -> Packed,
    no re-quantisation. GGUF's in_features is the tensor's first dimension (ne0)."""
    if fmt not in GGUF_BLOCK_BYTES:
        raise ValueError(f"{fmt} has no GGUF block layout")
    nb = -(-in_features // BLOCK)
    blocks = data.reshape(-1, nb, GGUF_BLOCK_BYTES[fmt])
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    if fmt == "q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1)
        return Packed(fmt, in_features, blocks[..., 4:].contiguous(), d, m)
    return Packed(fmt, in_features, blocks[..., 2:].contiguous(), d)
