"""`load_for_inference`: a model directory -> (model, tokenizer), weights in [infer] weight_format.

The one loader the engine's callers share (LLM, AsyncEngine.from_dir, a draft model, the eval gate); it knows
nothing of the engine, so anything can use it without importing the engine.
"""
from __future__ import annotations

from pathlib import Path

import torch

from tinystack.config import InferConfig
from tinystack.infer.numpy_backend import load_numpy_model
from tinystack.infer.quant.auto import choose_format
from tinystack.infer.quant.linear import quantize_model
from tinystack.model.io import load_model
from tinystack.tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # weight formats that are a whole-model dtype


def load_for_inference(model_dir: str | Path, config: InferConfig | None = None, device: str = "cpu",
                       tokenizer: bool | object = True) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer or None) for a model directory, ready for the engine, from [infer] runtime and
    weight_format. `tokenizer`: True loads the directory's, False loads none, a tokenizer object is used as
    given (also by weight_format "auto" to score formats).

    weight_format "auto" (CPU): the format measured fastest within the perplexity bounds on this machine
    (infer.quant.auto, cached per model/CPU/torch; float32 elsewhere); float32 / bfloat16: the whole model in
    that dtype; bf16 / q8_0 / q4_0 / q4_1: float32 activations with the linear weights in that format."""
    config = config or InferConfig()
    fmt = config.weight_format
    tok = (load_tokenizer(model_dir) if tokenizer else None) if isinstance(tokenizer, bool) else tokenizer
    if config.runtime == "numpy":
        return load_numpy_model(model_dir), tok
    model = load_model(model_dir, device=device, dtype=DTYPES.get(fmt, torch.float32))
    if fmt == "auto" and torch.device(device).type == "cpu":
        fmt = choose_format(model, model_dir, tok or load_tokenizer(model_dir)).quantize or "float32"
    if fmt not in DTYPES and fmt != "auto":
        quantize_model(model, fmt)
    return model, tok
