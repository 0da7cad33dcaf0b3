"""Moving weights between the NumPy GPT and the PyTorch GPT, and so to/from a model directory.

Both models use the same parameter names, so conversion is a name-for-name copy; the
model directory format stays `tinystack.model.io`'s alone (the NumPy side goes
through a PyTorch GPT built from the same state dict, never writing safetensors itself):

    numpy GPT --to_torch--> torch GPT --model.io.save_model--> model_dir/
    model_dir/ --model.io.load_model--> torch GPT --from_torch--> numpy GPT
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import DTypeLike

from tinystack.model.gpt import GPT as TorchGPT
from tinystack.model.io import load_model, save_model
from tinystack.nn.gpt import GPT

TIED = "lm_head.weight"  # torch's alias of transformer.wte.weight


def to_torch(model: GPT, dtype: torch.dtype | None = None) -> TorchGPT:
    """A PyTorch GPT holding copies of `model`'s weights (dtype: the NumPy dtype's by default)."""
    dtype = dtype or (torch.float64 if model.dtype == np.float64 else torch.float32)
    tm = TorchGPT(model.config).to(dtype)
    state = {n: torch.from_numpy(np.ascontiguousarray(p)) for n, p in model.named_parameters()}
    state[TIED] = state["transformer.wte.weight"]
    tm.load_state_dict(state)
    return tm


def from_torch(tm: TorchGPT, dtype: DTypeLike = np.float32) -> GPT:
    """A NumPy GPT holding copies of the PyTorch GPT's weights (dropout from its config)."""
    model = GPT(tm.config, dtype=dtype)
    state = {n: t.detach().cpu().double().numpy() for n, t in tm.state_dict().items() if n != TIED}
    model.load_state_dict(state)
    return model


def save_numpy_gpt(model: GPT, model_dir: str | Path, *, eos_token_id: int | None = None,
                   lineage: dict[str, Any] | None = None) -> Path:
    """Write the model directory (config.json + model.safetensors [+ tinystack.json]) via model.io."""
    return save_model(to_torch(model, torch.float32), model_dir, eos_token_id=eos_token_id, lineage=lineage)


def load_numpy_gpt(model_dir: str | Path, dtype: DTypeLike = np.float32) -> GPT:
    """Read a model directory (ours or HF GPT-2) into a NumPy GPT."""
    return from_torch(load_model(model_dir), dtype)
