"""The PyTorch model and the model directory format.

    GPTConfig -> GPT (gpt.py)            a GPT-2-architecture language model
    LlamaConfig -> Llama (llama.py)      the Llama family (RMSNorm, RoPE, SwiGLU, GQA; Qwen2 QKV bias)
    attention.py                         causal attention over an optional KV cache, shared by both
    fused_linear.py                      fuse_rows: q/k/v (gate/up) as one linear layer, same numbers
    contract.py                          LanguageModel: what the engine and the trainer rely on, every family
    GPT <-> model_dir/ (io.py)           config.json + model.safetensors + tokenizer.json + tinystack.json
    HF Llama-family dir -> Llama (io.py) the same load_model, dispatched on model_type
    GGUF / HF dir / name -> model_dir/   `tinystack model import` (importer.py; GGUF: gguf_model.py,
                                         gguf_dequant.py, gguf_tokenizer.py, stream_safetensors.py)

The C++ passes the Llama block takes under bf16 training live in tinystack/kernels/ (fused_ops, fused_attention).
Training writes a model directory; evaluation, inference and serving read it.
The format is Hugging Face's GPT-2 layout, so the same loader reads HF GPT-2 checkpoints.
"""
from tinystack.lazy import lazy_exports

_EXPORTS = {
    "GPT": "tinystack.model.gpt",
    "GPTConfig": "tinystack.model.gpt_config",
    "ModelFormatError": "tinystack.model.io",
    "load_model": "tinystack.model.io",
    "read_lineage": "tinystack.model.io",
    "save_model": "tinystack.model.io",
    "Llama": "tinystack.model.llama",
    "LlamaConfig": "tinystack.model.llama",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["GPT", "GPTConfig", "Llama", "LlamaConfig", "ModelFormatError", "load_model", "read_lineage", "save_model"]
