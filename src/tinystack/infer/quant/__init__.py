"""Weight formats that stay quantised in memory, their CPU kernels, and the load-time choice between them.

    formats.py   quantize(W, fmt) -> Packed, dequantize, to_gguf / from_gguf   bf16 | q8_0 | q4_0 | q4_1
                 (GGUF's block layouts and llama.cpp's rounding, bit for bit; packed by the C++ extension
                 where it builds: tinystack/kernels/quant/pack.cpp)
    kernels.py   matmul(x, packed): the C++ kernels (tinystack/kernels/quant: built at first use, path
                 avx512 | avx2 | cpp | torch) for short inputs, a float GEMM for long ones; what they take
                 is data (KERNEL_TAKES), anything else runs the torch reference
    linear.py    QuantLinear / QuantEmbedding / quantize_model(model, fmt)
    auto.py      weight_format="auto": time each format's decode matmuls here, check perplexity, pick, cache
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
