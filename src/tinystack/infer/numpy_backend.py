"""backend="numpy": the engine driving the NumPy GPT of `tinystack.nn.gpt` (issue 4's model).

That model's forward takes whole sequences (it has no KV cache), so the ModelRunner
feeds it each sequence's full token list and takes the last position's logits
(`needs_full_sequence`); scheduling, sampling, stopping and block accounting are the
same as with the torch backend. It is the reference the torch backend is checked
against, not a fast path: each step recomputes the whole sequence.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tinystack.nn.gpt_io import load_numpy_gpt


class NumpyGPTAdapter(torch.nn.Module):
    needs_full_sequence = True

    def __init__(self, np_model):
        super().__init__()
        self.np_model = np_model.eval()
        self.config = np_model.config
        self.weight_bytes = sum(p.nbytes for _, p in np_model.named_parameters())
        # the engine reads device and dtype off the first parameter
        self._probe = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    def last_logits(self, token_ids: list[int]) -> torch.Tensor:
        logits = self.np_model.forward(np.asarray([token_ids], dtype=np.int64))
        return torch.from_numpy(np.ascontiguousarray(logits[0, -1], dtype=np.float32))


def load_numpy_model(model_dir: str | Path) -> NumpyGPTAdapter:
    return NumpyGPTAdapter(load_numpy_gpt(model_dir))
