"""Hand-built GGUF dequantisation is bit-identical to llama.cpp's Python reference (`gguf.quants.dequantize`)."""
import numpy as np
import pytest
from gguf_helpers import F16_FIELDS, QUANTISABLE, random_blocks

from tinystack.model.gguf_dequant import SUPPORTED_TYPES, UnsupportedQuantError, dequantize

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
BLOCKED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def _weights(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 30, (rows, 1)).astype(np.float32)
    x[0] = 0.0  # an all-zero block: scale 0, the reference's divide-by-zero guard
    x[1, ::7] = 1e4  # outliers that set a block's scale
    return x


@pytest.mark.parametrize("name", QUANTISABLE)
@pytest.mark.parametrize("shape", [(6, 256), (3, 4, 64)])
def test_quantised_weights_dequantise_bit_equal(name, shape):
    x = _weights(int(np.prod(shape[:-1])), shape[-1], seed=len(name)).reshape(shape)
    q = gguf.quants.quantize(x, T[name])
    ours = dequantize(q, T[name], shape)
    _same_bits(ours, gguf.quants.dequantize(q, T[name]))
    # and it is the tensor that was quantised, to within the format's precision
    tol = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1e-2, "Q5_0": 0.07, "Q5_1": 0.07}.get(name, 0.15)
    block_max = np.abs(x).max(axis=-1, keepdims=True)
    assert np.all(np.abs(ours - x) <= tol * block_max + 1e-30)


@pytest.mark.parametrize("name", BLOCKED)
def test_random_blocks_dequantise_bit_equal(name):
    """Any bytes are a valid block (K-quants have no Python quantiser): random ones, finite scales."""
    block = gguf.GGML_QUANT_SIZES[T[name]][0]
    raw = random_blocks(5, 3 * block, name, np.random.default_rng(7))  # 5 rows of 3 blocks
    _same_bits(dequantize(raw, T[name], (5, 3 * block)), gguf.quants.dequantize(raw, T[name]))


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_every_16_bit_pattern(name):
    """All 65,536 half / bfloat16 values, NaNs and infinities included."""
    raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    ref = raw.view(np.float16).astype(np.float32) if name == "F16" else gguf.quants.dequantize(raw, T[name])
    _same_bits(dequantize(raw, T[name], (1 << 16,)), ref.reshape(-1))


def test_every_supported_type_is_covered_here():
    assert set(SUPPORTED_TYPES) == set(QUANTISABLE) | set(BLOCKED) and set(F16_FIELDS) == set(BLOCKED)


def test_unsupported_type_and_wrong_size_are_named():
    with pytest.raises(UnsupportedQuantError, match=r"unsupported GGUF tensor type IQ2_XXS \(supported: F32, "):
        dequantize(np.zeros(66, np.uint8), T.IQ2_XXS, (256,))
    with pytest.raises(UnsupportedQuantError, match=r"Q4_1 tensor of shape \(2, 32\) needs 40 bytes, has 20"):
        dequantize(np.zeros(20, np.uint8), T.Q4_1, (2, 32))
    with pytest.raises(UnsupportedQuantError, match=r"Q4_K tensor of shape \(2, 128\): rows are not whole"):
        dequantize(np.zeros(144, np.uint8), T.Q4_K, (2, 128))
