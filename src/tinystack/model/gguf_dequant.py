"""GGUF tensor data -> float32: hand-built, vectorised NumPy dequantisation of ggml's block formats.

A quantised ggml tensor is a row-major array of fixed-size *blocks*; each block stores
`block_size` consecutive values of one row (rows are always whole blocks) as small integers
plus one or two float16 numbers that map them back to floats. All multi-byte fields are
little-endian. The layouts (ggml-common.h), bytes per block, and the value they encode:

    F32   4 B / value                     the float itself
    F16   2 B / value                     IEEE half -> float32
    BF16  2 B / value                     the top 16 bits of a float32 (shift left by 16)
    Q8_0  34 B / 32:  d:f16 | q[32]:i8                       x = d * q
    Q4_0  18 B / 32:  d:f16 | qs[16]                          x = d * (q - 8)
    Q4_1  20 B / 32:  d:f16 | m:f16 | qs[16]                  x = d * q + m
    Q5_0  22 B / 32:  d:f16 | qh:u32 | qs[16]                 x = d * (q - 16)
    Q5_1  24 B / 32:  d:f16 | m:f16 | qh:u32 | qs[16]         x = d * q + m
    Q4_K  144 B / 256 ("super-block" of 8 sub-blocks of 32):
          d:f16 | dmin:f16 | scales[12] (8 six-bit scales + 8 six-bit mins) | qs[128]
                                                              x = (d * sc_j) * q - (dmin * m_j)
    Q5_K  176 B / 256: d:f16 | dmin:f16 | scales[12] | qh[32] | qs[128]   (as Q4_K, 5-bit q)
    Q6_K  210 B / 256: ql[128] | qh[64] | scales[16]:i8 | d:f16            x = (d * sc_j) * (q - 32)
    Q2_K  84 B / 256 (16 sub-blocks of 16): scales[16] (scale: low nibble, min: high) | qs[64] | d:f16 | dmin:f16
                                                              x = (d * sc_j) * q - (dmin * m_j)
    Q3_K  110 B / 256 (16 of 16): hmask[32] | qs[64] | scales[12] (16 six-bit) | d:f16
                                                              x = (d * (sc_j - 32)) * (q - 4), q 3-bit
    IQ4_NL 18 B / 32:  d:f16 | qs[16]                         x = d * T[q], T a fixed non-linear 16-entry grid
    IQ4_XS 136 B / 256 (8 of 32): d:f16 | scales_h:u16 | scales_l[4] | qs[128]
                                                              x = (d * (sc_j - 32)) * T[q]

4-bit values are packed two to a byte: in a 32-value block, byte i holds value i in its low
nibble and value i + 16 in its high nibble (K-quants: each 32-byte run holds two sub-blocks,
low nibbles then high nibbles). The fifth bit of Q5 values is bit i of `qh` for value i. 2-bit
values (Q2_K, Q3_K's low bits) are packed four to a byte: in each half of 128 values, byte l of its
32 holds values l, 32 + l, 64 + l, 96 + l in bits 0-1, 2-3, 4-5, 6-7.
The arithmetic is done in float32 in the order ggml's reference code does it, so the result
is bit-identical to `gguf.quants.dequantize` (tests/model/test_gguf_dequant.py). Any other
type (IQ1-3*, TQ*, ...) raises ModelFormatError naming it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

QK_K = 256
_CHUNK_BLOCKS = 1 << 16  # blocks dequantised per step: bounds the temporaries, not the result


class UnsupportedQuantError(ValueError):
    """The tensor's ggml type has no dequantiser here."""


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] bytes -> [n, 1] float32 (a little-endian IEEE half per row)."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., k] bytes -> [..., 2k] values 0..15: every low nibble first, then every high nibble."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(qh: np.ndarray, n: int) -> np.ndarray:
    """[rows, 4] bytes (one little-endian u32) -> [rows, n] bit i of it, i < n."""
    word = np.ascontiguousarray(qh).view("<u4")  # [rows, 1]
    return ((word >> np.arange(n, dtype=np.uint32)) & 1).astype(np.uint8)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    return d * b[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    return d * (_nibbles(b[:, 2:]).astype(np.int8) - 8).astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:]).astype(np.float32) + m


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 6:]) | (_bits(b[:, 2:6], 32) << 4)
    return d * (q.astype(np.int8) - 16).astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:]) | (_bits(b[:, 4:8], 32) << 4)
    return d * q.astype(np.float32) + m


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (scales, mins), each [n, 8] in 0..63.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales/mins 4-7 take
    their low 4 bits from bytes 8-11 (scale: low nibble, min: high nibble) and their top 2
    bits from the spare top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: q [n, 8, 32] -> (d * scale) * q - (dmin * min), per sub-block."""
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    scale, offset = (d * sc)[..., None], (dmin * mn)[..., None]
    return (scale * q.astype(np.float32) - offset).reshape(len(b), QK_K)


def _q4_k(b: np.ndarray) -> np.ndarray:
    # qs: 4 runs of 32 bytes; run r holds sub-block 2r (low nibbles) and 2r + 1 (high nibbles)
    q = _nibbles(b[:, 16:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    return _k_affine(b, q)


def _q5_k(b: np.ndarray) -> np.ndarray:
    low = _nibbles(b[:, 48:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    qh = b[:, 16:48]  # [n, 32]: bit j of byte l is the fifth bit of value l of sub-block j
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return _k_affine(b, low | (high << 4))


def _q6_k(b: np.ndarray) -> np.ndarray:
    # Two halves of 128 values. Half h: ql bytes [64h, 64h + 64) give the low 4 bits (low nibbles ->
    # values 0..63, high nibbles -> 64..127); qh bytes [32h, 32h + 32) give the top 2 bits, value
    # 32k + l taking bits 2k, 2k + 1 of byte l.
    n = len(b)
    low = _nibbles(b[:, :128].reshape(n, 2, 64))  # [n, 2, 128]
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    q = (low | ((qh & 3).reshape(n, 2, 128) << 4)).astype(np.int8) - 32
    sc = b[:, 192:208].view(np.int8).astype(np.float32)  # one per 16 values
    d = _f16(b[:, 208:210])
    return ((d * sc)[..., None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """[n, 64] bytes -> [n, 256] 2-bit values: per half of 32 bytes, bits 0-1 of each byte, then 2-3, 4-5, 6-7."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, QK_K)


def _q2_k(b: np.ndarray) -> np.ndarray:
    n, s = len(b), b[:, :16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    scale, offset = (d * (s & 0x0F).astype(np.float32))[..., None], (dmin * (s >> 4).astype(np.float32))[..., None]
    return (scale * _crumbs(b[:, 16:80]).reshape(n, 16, 16).astype(np.float32) - offset).reshape(n, QK_K)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes -> [n, 16] scales in -32..31. Scale k's low 4 bits: byte k % 8, low nibble for
    k < 8, high nibble after; its top 2 bits: byte 8 + k % 4, bits 2 (k // 4) and 2 (k // 4) + 1."""
    low = np.concatenate([s[:, :8] & 0x0F, s[:, :8] >> 4], axis=-1)
    top = (s[:, None, 8:12] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3  # [n, k // 4, k % 4]
    return (low | (top.reshape(-1, 16) << 4)).astype(np.int8) - 32


def _q3_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    # the third bit of value 32 m + l (m < 8) is bit m of hmask byte l; a clear bit means q - 4
    high = (b[:, None, :32] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [n, 8, 32]
    q = _crumbs(b[:, 32:96]).astype(np.int8) - (4 * (1 - high)).reshape(n, QK_K).astype(np.int8)
    scale = (_f16(b[:, 108:110]) * _q3_k_scales(b[:, 96:108]).astype(np.float32))[..., None]
    return (scale * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


# IQ4's grid: 16 levels spaced more finely near zero, where most weights are (ggml's kvalues_iq4nl)
_IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * _IQ4_GRID[_nibbles(b[:, 2:])]


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    # sub-block j's 6-bit scale: nibble j % 2 of scales_l[j // 2] | bits 2j, 2j + 1 of scales_h, minus 32
    n, high = len(b), np.ascontiguousarray(b[:, 2:4]).view("<u2")  # [n, 1]
    low = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=-1).reshape(n, 8)
    top = ((high >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)
    scale = (_f16(b[:, :2]) * ((low | (top << 4)).astype(np.int8) - 32).astype(np.float32))[..., None]
    return (scale * _IQ4_GRID[_nibbles(b[:, 8:].reshape(n, 8, 16))]).reshape(n, QK_K)


# ggml type id -> (name, values per block, bytes per block, block dequantiser or None for plain floats)
_TYPES: dict[int, tuple[str, int, int, Callable[[np.ndarray], np.ndarray] | None]] = {
    0: ("F32", 1, 4, None), 1: ("F16", 1, 2, None), 30: ("BF16", 1, 2, None),
    8: ("Q8_0", 32, 34, _q8_0), 2: ("Q4_0", 32, 18, _q4_0), 3: ("Q4_1", 32, 20, _q4_1),
    6: ("Q5_0", 32, 22, _q5_0), 7: ("Q5_1", 32, 24, _q5_1),
    10: ("Q2_K", QK_K, 84, _q2_k), 11: ("Q3_K", QK_K, 110, _q3_k),
    12: ("Q4_K", QK_K, 144, _q4_k), 13: ("Q5_K", QK_K, 176, _q5_k), 14: ("Q6_K", QK_K, 210, _q6_k),
    20: ("IQ4_NL", 32, 18, _iq4_nl), 23: ("IQ4_XS", QK_K, 136, _iq4_xs),
}
SUPPORTED_TYPES = tuple(name for name, *_ in _TYPES.values())


def type_name(ggml_type: int) -> str:
    try:
        # deferred: gguf only when a GGUF file is read
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(int(ggml_type)).name
    except (ImportError, ValueError):
        return _TYPES.get(int(ggml_type), (f"type {int(ggml_type)}",))[0]


def dequantize(raw: np.ndarray, ggml_type: int, shape: Sequence[int]) -> np.ndarray:
    """Raw tensor bytes (any shape, C-contiguous) of ggml type `ggml_type` -> float32 array of `shape`
    (NumPy order: GGUF's dims reversed, the last dim is the row, i.e. the blocked one)."""
    if int(ggml_type) not in _TYPES:
        raise UnsupportedQuantError(f"unsupported GGUF tensor type {type_name(ggml_type)} "
                                    f"(supported: {', '.join(SUPPORTED_TYPES)})")
    name, block, nbytes, fn = _TYPES[int(ggml_type)]
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    n = int(np.prod(shape, dtype=np.int64))
    if shape and shape[-1] % block:  # blocks never straddle rows
        raise UnsupportedQuantError(f"{name} tensor of shape {tuple(shape)}: rows are not whole blocks of {block}")
    if data.size != n // block * nbytes:
        raise UnsupportedQuantError(f"{name} tensor of shape {tuple(shape)} needs {n // block * nbytes} bytes, "
                                    f"has {data.size}")
    if fn is None:
        if name == "F32":
            return data.view("<f4").astype(np.float32).reshape(shape)  # a copy: the source may be a read-only mmap
        if name == "F16":
            return data.view("<f2").astype(np.float32).reshape(shape)
        return (data.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)  # BF16
    blocks = data.reshape(-1, nbytes)
    out = np.empty((len(blocks), block), dtype=np.float32)
    for i in range(0, len(blocks), _CHUNK_BLOCKS):
        out[i:i + _CHUNK_BLOCKS] = fn(blocks[i:i + _CHUNK_BLOCKS])
    return out.reshape(shape)
