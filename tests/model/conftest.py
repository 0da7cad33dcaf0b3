"""Session fixture for the SmolLM2 reference tests: `transformers`' own loading of the packaged GGUF, once
(~15-20 s on 2 CPU cores; the imported model directory, `smollm2_dir`, is tests/conftest.py's)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_gguf):
    """(model, tokenizer) as `transformers` builds them from the GGUF (its dequantisation, its tokenizer)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    d, name = str(smollm2_gguf.parent), smollm2_gguf.name
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
