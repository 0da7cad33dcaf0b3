"""Shared fixtures: a tiny random GPT + a BPE tokenizer trained here, engines, and a real server.

Everything is built in the test process (no files from outside, no downloads). The
server is real uvicorn on 127.0.0.1 (random port) started with run_in_background.
"""
from __future__ import annotations

import random
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import pytest
from serve_helpers import FaultyModel, tiny_gpt, unbatched  # noqa: E402  (shared with the test files)

from tinystack.config import InferConfig, RunConfig, ServeConfig
from tinystack.infer import AsyncEngine, LLMEngine
from tinystack.model import GPT
from tinystack.model.io import save_model
from tinystack.observe import RequestLog, setup_request_log
from tinystack.serve import create_app, run_in_background
from tinystack.tokenizer import BPETokenizer

WORDS = ("return the number of items in the list value error if key is missing default none "
         "this module provides a small parser for config files and raises when input is invalid").split()


@pytest.fixture(scope="session")
def tokenizer() -> BPETokenizer:
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + f" {i}." for i in range(400)]
    return BPETokenizer.train(texts, vocab_size=300)


@pytest.fixture
def tiny_model(tokenizer: BPETokenizer) -> GPT:
    """A fresh tiny random GPT (seeded), for tests that build their own engine around it."""
    return tiny_gpt(tokenizer)


@pytest.fixture
def model_dir(tmp_path: Path, tokenizer: BPETokenizer, tiny_model: GPT) -> Path:
    """The tiny model and its tokenizer written as a model directory (for CLI and subprocess tests)."""
    path = tmp_path / "model"
    save_model(tiny_model, path, eos_token_id=tokenizer.eos_token_id)
    tokenizer.save(path)
    return path


@pytest.fixture
def engine(tokenizer: BPETokenizer) -> Iterator[AsyncEngine]:
    """An unbatched AsyncEngine over the tiny GPT (shut down at teardown)."""
    engine = unbatched(tiny_gpt(tokenizer), tokenizer)
    yield engine
    engine.shutdown()


@pytest.fixture(params=["unbatched", "continuous"])
def faulty_engine(request, tokenizer: BPETokenizer) -> Iterator[AsyncEngine]:
    """An AsyncEngine, unbatched (max_num_seqs=1) or continuous batching (paged KV cache), whose model
    is a FaultyModel, reachable as `.fault`: set delay_s / fail_rate / failing on it."""
    fault = FaultyModel(tiny_gpt(tokenizer))
    if request.param == "unbatched":
        engine = unbatched(fault, tokenizer)
    else:
        engine = AsyncEngine(LLMEngine(fault, tokenizer, InferConfig(max_num_seqs=8, num_kv_blocks=64)))
    engine.fault = fault
    yield engine
    engine.shutdown()


@pytest.fixture
def async_engine(tokenizer: BPETokenizer) -> Iterator[AsyncEngine]:
    """A continuous-batching AsyncEngine over the tiny GPT (shut down at teardown)."""
    engine = AsyncEngine(LLMEngine(tiny_gpt(tokenizer), tokenizer, InferConfig(max_num_seqs=8, num_kv_blocks=64)))
    yield engine
    engine.shutdown()


class Served:
    """A running server: its base URL, the engine, the app (app.state.server is the live
    ServerState: adapter counters, breaker, gate) and its request log (if any)."""

    def __init__(self, url: str, engine: AsyncEngine, app, log: RequestLog | None, log_path: Path | None):
        self.url, self.engine, self.app, self.log, self.log_path = url, engine, app, log, log_path

    @property
    def state(self):
        return self.app.state.server


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """serve(engine, log=False, include_text=False, model_dir=None, max_num_seqs=None, registry=RunConfig's,
    **ServeConfig overrides) -> Served; stopped at teardown. `max_num_seqs` caps the engine's scheduler
    (infer.max_num_seqs; never above what the engine was built for, so an unbatched engine stays unbatched); the
    admission gate follows it."""
    with ExitStack() as stack:
        def start(engine: AsyncEngine, log: bool = False, include_text: bool = False, model_dir: Path | None = None,
                  max_num_seqs: int | None = None, registry: Path | str = RunConfig.registry, **overrides) -> Served:
            if max_num_seqs is not None:
                scheduler = engine.engine.scheduler
                stack.callback(setattr, scheduler, "max_num_seqs", scheduler.max_num_seqs)
                scheduler.max_num_seqs = min(max_num_seqs, scheduler.max_num_seqs)
            cfg = replace(ServeConfig(), **overrides)
            log_path = tmp_path / f"requests-{len(list(tmp_path.iterdir()))}.jsonl" if log else None
            request_log = setup_request_log(log_path, include_text=include_text) if log else None
            if request_log is not None:
                stack.callback(request_log.close)  # after the server stopped (callbacks run LIFO)
            app = create_app(engine, cfg, request_log, model_dir=model_dir, registry=registry)
            url = stack.enter_context(run_in_background(app, startup_timeout_s=10, shutdown_timeout_s=5))
            return Served(url, engine, app, request_log, log_path)

        yield start
