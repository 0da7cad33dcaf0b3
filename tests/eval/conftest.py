"""Fixtures for the evaluation tests: a tiny GPT trained in seconds on a toy language.

The toy language is generated from a small grammar, so a 1-layer model learns it
well within ~200 steps; random-letter "noise" documents stay unpredictable to it,
which is what the attribution tests plant into a held-out split.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tinystack.model.gpt import GPT, GPTConfig
from tinystack.model.io import save_model
from tinystack.tokenizer import BPETokenizer

NOUNS = ["cat", "dog", "bird", "fish", "horse", "mouse", "lion", "frog"]
VERBS = ["sees", "likes", "chases", "follows", "finds", "hears"]
ADJS = ["big", "small", "red", "old", "quick", "lazy"]


def toy_sentence(rng: random.Random) -> str:
    return (f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
            f"the {rng.choice(ADJS)} {rng.choice(NOUNS)}.")


def toy_doc(rng: random.Random, n_sentences: int) -> str:
    return " ".join(toy_sentence(rng) for _ in range(n_sentences))


def noise_doc(rng: random.Random, n_chars: int) -> str:
    letters = "qxzjkvwyupgbmcdfhlnrst0123456789#@%"
    return "".join(rng.choice(letters) for _ in range(n_chars))


def _train(model: GPT, tokens: np.ndarray, steps: int, seed: int = 0) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only fight the other processes on the machine
    try:
        _steps(model, tokens, steps, seed)
    finally:
        torch.set_num_threads(threads)


def _steps(model: GPT, tokens: np.ndarray, steps: int, seed: int) -> None:
    torch.manual_seed(seed)
    T = model.config.block_size
    data = torch.from_numpy(tokens.astype(np.int64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        ix = torch.randint(len(data) - T - 1, (16,), generator=gen)
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory) -> Path:
    """A model directory (weights + tokenizer) trained on the toy language."""
    rng = random.Random(0)
    texts = [toy_doc(rng, rng.randint(1, 6)) for _ in range(400)]
    tok = BPETokenizer.train(texts, vocab_size=300)
    ids: list[int] = []
    for t in texts:
        ids += tok.encode_ordinary(t) + [tok.eos_token_id]
    torch.manual_seed(0)  # the init must not depend on which tests ran before
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=48))
    _train(model, np.asarray(ids), steps=200)
    out = tmp_path_factory.mktemp("toy_model")
    save_model(model, out, eos_token_id=tok.eos_token_id)
    tok.save(out)
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def planted_data_dir(tmp_path) -> Path:
    """train/val/test JSONL of toy text; val also holds a `noise` source and one near copy of a train doc."""
    rng = random.Random(1)
    train = [{"text": toy_doc(rng, rng.randint(2, 5)), "source": f"toy{i % 5}", "id": f"tr{i}"} for i in range(60)]
    val = [{"text": toy_doc(rng, rng.randint(1, 5)), "source": f"toy{i % 4}", "id": f"va{i}"} for i in range(24)]
    val += [{"text": noise_doc(rng, rng.randint(40, 120)), "source": "noise", "id": f"nz{i}"} for i in range(6)]
    leaked = train[7]["text"]
    val.append({"text": leaked[:-1] + "!", "source": "toy1", "id": "leak"})  # a near (not exact) duplicate
    test = [{"text": toy_doc(rng, rng.randint(1, 5)), "source": f"toy{i % 3}", "id": f"te{i}"} for i in range(12)]
    for i, r in enumerate(val):
        r["cluster_id"] = 1000 + i  # what the data layer's near dedup writes on every record
    for name, recs in (("train", train), ("val", val), ("test", test)):
        write_jsonl(tmp_path / "data" / f"{name}.jsonl", recs)
    return tmp_path / "data"


@pytest.fixture(scope="session")
def toy_rng_doc():
    return toy_doc, noise_doc
