"""Fixtures for the inference tests (helpers live in infer_helpers.py)."""
from __future__ import annotations

import pytest
from infer_helpers import ToyTokenizer, _hf_model


@pytest.fixture(scope="session", params=["gpt2", "llama", "qwen2", "qwen3"])
def family(request, tmp_path_factory):
    """(kind, HF model, model directory it was saved to)."""
    hf = _hf_model(request.param)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d, safe_serialization=True)
    return request.param, hf, d


@pytest.fixture
def toy_tokenizer() -> ToyTokenizer:
    return ToyTokenizer()


@pytest.fixture(autouse=True)
def weight_format_cache(tmp_path_factory, monkeypatch):
    """dtype="auto" caches its decisions in a per-session directory, not the user's ~/.cache."""
    from tinystack.infer.quant import auto

    d = tmp_path_factory.getbasetemp() / "weight_format_cache"
    monkeypatch.setattr(auto, "CACHE_DIR", d)
    return d
