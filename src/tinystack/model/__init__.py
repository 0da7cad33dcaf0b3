"""The PyTorch model and the model directory format.

    GPTConfig -> GPT (gpt.py)            a GPT-2-architecture language model
    GPT <-> model_dir/ (io.py)           config.json + model.safetensors + tokenizer.json + tinystack.json

Training writes a model directory; evaluation, inference and serving read it.
The format is Hugging Face's GPT-2 layout, so the same loader reads HF GPT-2 checkpoints.
"""
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.model.io import ModelFormatError, load_model, read_lineage, save_model

__all__ = ["GPT", "GPTConfig", "ModelFormatError", "load_model", "read_lineage", "save_model"]
