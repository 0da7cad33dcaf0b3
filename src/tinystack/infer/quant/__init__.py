"""Weight formats that stay quantised in memory, their CPU kernels, and the load-time choice between them.

    formats.py   quantize(W, fmt) -> Packed, dequantize, to_gguf / from_gguf   bf16 | q8_0 | q4_0 | q4_1
                 (GGUF's block layouts and llama.cpp's rounding, bit for bit)
    pack.cpp     the packer and dequantiser in C++ (llama.cpp's rounding; fallbacks: formats.quantize_torch,
                 model/gguf_dequant.py)
    kernels.cpp  y = x @ W^T for packed W: AVX-512 VNNI int8 dot products with activations quantised
                 per block of 32 (bf16: fp32 FMAs), plain C++ twins; output rows shared
                 between torch's threads so that a late thread never delays the caller (pool.h); the
                 AVX-512 and AVX2 paths in kernels_avx512.h / kernels_avx2.h (one translation unit)
    kernels.py   builds the extension at first use; picks avx512 | avx2 | cpp | torch (TINYSTACK_QUANT_KERNEL)
    linear.py    QuantLinear / QuantEmbedding / quantize_model(model, fmt)
    auto.py      dtype="auto": time each format's decode matmuls here, check perplexity, pick, cache
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "FORMATS": "tinystack.infer.quant.formats",
    "Packed": "tinystack.infer.quant.formats",
    "quantize": "tinystack.infer.quant.formats",
    "dequantize": "tinystack.infer.quant.formats",
    "from_gguf": "tinystack.infer.quant.formats",
    "to_gguf": "tinystack.infer.quant.formats",
    "QuantLinear": "tinystack.infer.quant.linear",
    "QuantEmbedding": "tinystack.infer.quant.linear",
    "quantize_model": "tinystack.infer.quant.linear",
    "choose_format": "tinystack.infer.quant.auto",
    "Choice": "tinystack.infer.quant.auto",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
