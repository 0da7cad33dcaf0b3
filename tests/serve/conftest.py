"""Shared fixtures: a tiny random GPT + a BPE tokenizer trained here, engines, and a real server.

Everything is built in the test process (no files from outside, no downloads). The
server is real uvicorn on 127.0.0.1 (random port) started with run_in_background.
"""
from __future__ import annotations

import random
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from tinystack.config import ServeConfig
from tinystack.infer import Engine, Generation, SamplingParams
from tinystack.model import GPT, GPTConfig
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


def tiny_gpt(tokenizer: BPETokenizer) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=32))


@pytest.fixture
def tiny_model(tokenizer: BPETokenizer) -> GPT:
    """A fresh tiny random GPT (seeded), for tests that build their own Engine subclass."""
    return tiny_gpt(tokenizer)


@pytest.fixture(scope="session")
def engine(tokenizer: BPETokenizer) -> Engine:
    return Engine(tiny_gpt(tokenizer), tokenizer)


class SlowEngine(Engine):
    """Generates `max_tokens` dummy tokens, sleeping `delay_s` per token and checking `cancel` before each.

    Records how many generations run at once and how each one ended, so tests can
    check the concurrency limit and that a timed-out generation really stopped.
    """

    def __init__(self, model: GPT, tokenizer: BPETokenizer, delay_s: float = 0.05):
        super().__init__(model, tokenizer)
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.finished: list[Generation] = []

    def generate(self, prompt: str, params: SamplingParams, cancel: threading.Event | None = None,
                 on_token: Callable[[int], None] | None = None) -> Generation:
        ids = self.encode_prompt(prompt)
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            out: list[int] = []
            finish = "length"
            t0 = time.perf_counter()
            while len(out) < params.max_tokens:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                time.sleep(self.delay_s)
                out.append(ids[-1])
        finally:
            with self.lock:
                self.active -= 1
        gen = Generation(self.tokenizer.decode(out), out, len(ids), finish, prefill_s=0.0,
                         decode_s=time.perf_counter() - t0)
        with self.lock:
            self.finished.append(gen)
        return gen


@pytest.fixture
def slow_engine(tokenizer: BPETokenizer) -> SlowEngine:
    return SlowEngine(tiny_gpt(tokenizer), tokenizer)


class Served:
    """A running server: its base URL, the engine behind it and its request log (if any)."""

    def __init__(self, url: str, engine: Engine, log: RequestLog | None, log_path: Path | None):
        self.url, self.engine, self.log, self.log_path = url, engine, log, log_path


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """serve(engine, log=False, include_text=False, **ServeConfig overrides) -> Served; stopped at teardown."""
    with ExitStack() as stack:
        def start(engine: Engine, log: bool = False, include_text: bool = False, **overrides) -> Served:
            cfg = replace(ServeConfig(), **overrides)
            log_path = tmp_path / f"requests-{len(list(tmp_path.iterdir()))}.jsonl" if log else None
            request_log = setup_request_log(log_path, include_text=include_text) if log else None
            if request_log is not None:
                stack.callback(request_log.close)  # after the server stopped (callbacks run LIFO)
            url = stack.enter_context(run_in_background(create_app(engine, cfg, request_log), startup_timeout_s=10,
                                                        shutdown_timeout_s=5))
            return Served(url, engine, request_log, log_path)

        yield start
