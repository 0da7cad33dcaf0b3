"""Fixtures for the inference tests (helpers live in infer_helpers.py)."""
from __future__ import annotations

import pytest

from infer_helpers import ToyTokenizer, _hf_model


@pytest.fixture(scope="session", params=["gpt2", "llama", "qwen2"])
def family(request, tmp_path_factory):
    """(kind, HF model, model directory it was saved to)."""
    hf = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d, safe_serialization=True)
    return request.param, hf, d


@pytest.fixture
def toy_tokenizer() -> ToyTokenizer:
    return ToyTokenizer()
