"""Session fixture for the SmolLM2 reference tests: `transformers`' own loading of the packaged GGUF, once
(the imported model directory, `smollm2_dir`, is tests/conftest.py's)."""
from __future__ import annotations

import functools

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_gguf):
    """(model, tokenizer) as `transformers` builds them from the GGUF (its dequantisation, its tokenizer).

    transformers parses the file with gguf's GGUFReader three times (config, weights, tokenizer) and builds gguf's
    tensor-name map once per submodule (~400 times): both are pure functions of their arguments, used read-only,
    so they are memoised for this load only. What transformers computes from them is unchanged; the set-up takes
    about half as long (~35 s -> ~15 s on the loaded 2-core machine)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    gguf = pytest.importorskip("gguf")

    d, name = str(smollm2_gguf.parent), smollm2_gguf.name
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    return model, tokenizer
