"""The training loop learns, follows the schedule, refuses to continue on a non-finite loss."""
import json
import math
import threading

import numpy as np
import pytest
import torch

from tinystack.config import TrainConfig
from tinystack.eval.scoring import score_tokens
from tinystack.model import GPT, GPTConfig
from tinystack.nn.schedule import lr_at
from tinystack.train import NonFiniteLossError, get_batch, make_optimizer, train


def _tokens(n=4000, vocab=16, seed=0):
    """A learnable stream: a fixed random permutation cycle with 10% noise tokens."""
    rng = np.random.default_rng(seed)
    cycle = rng.permutation(vocab)
    seq = np.tile(cycle, n // vocab + 1)[:n]
    noise = rng.random(n) < 0.1
    seq[noise] = rng.integers(0, vocab, noise.sum())
    return seq.astype(np.uint16)


def _cfg(**kw):
    base = dict(max_iters=80, batch_size=8, learning_rate=1e-2, min_lr=1e-3, warmup_iters=5,
                eval_interval=40, eval_iters=3, seed=0)
    return TrainConfig(**{**base, **kw})


def test_training_reduces_loss_and_writes_a_log(tmp_path):
    gcfg = GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=32)
    tr = _tokens(seed=0)
    cfg = _cfg()
    untrained = score_tokens(GPT(gcfg), tr).loss
    model, result = train(gcfg, tr, tr, cfg, log_path=tmp_path / "log.jsonl", progress=False)
    assert untrained > math.log(16) * 0.9  # starts near uniform
    assert result.final_val_loss < 0.6 * untrained  # and learns the cycle
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(cfg.max_iters))
    assert sum("val_loss" in r for r in lines) == 2  # at step 40 and at the end
    assert [r["final_val_loss"] for r in lines if "final_val_loss" in r] == [result.final_val_loss]  # the last
    assert all(r["lr"] == pytest.approx(lr_at(r["step"], max_lr=cfg.learning_rate, min_lr=cfg.min_lr,
                                                 warmup_iters=cfg.warmup_iters, max_iters=cfg.max_iters))
               for r in lines)
    assert not model.training


def test_same_seed_same_model():
    gcfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=16)
    runs = [train(gcfg, _tokens(), None, _cfg(max_iters=10), progress=False)[0] for _ in range(2)]
    for a, b in zip(runs[0].parameters(), runs[1].parameters()):
        assert torch.equal(a, b)


def test_non_finite_loss_stops_with_the_step():
    gcfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=16)
    with pytest.raises(NonFiniteLossError, match="at step"):
        train(gcfg, _tokens(), None, _cfg(learning_rate=1e30, min_lr=1e29, max_iters=50, grad_clip=1e30),
              progress=False)


def test_batches_are_next_token_windows():
    tokens = np.arange(100, dtype=np.uint16)
    x, y = get_batch(tokens, 4, 10, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert x.shape == y.shape == (4, 10)
    assert torch.equal(y, x + 1)
    with pytest.raises(ValueError, match="need more than block_size=10"):
        get_batch(tokens[:10], 1, 10, torch.Generator(), torch.device("cpu"))


def test_weight_decay_skips_biases_norms_and_embeddings():
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=16))
    decay, no_decay = make_optimizer(model, _cfg()).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and "ln" not in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"transformer.wte.weight", "transformer.wpe.weight",
                                                         "transformer.ln_f.weight", "transformer.h.0.attn.c_attn.bias"}


def test_progress_bar_draws_from_the_loop_without_a_refresh_thread(capsys):
    """rich's auto-refresh thread would redraw 10x a second while torch computes; the loop redraws between steps."""
    from rich.live import _RefreshThread

    from tinystack.train import BatchSampler
    from tinystack.train.loop import train_model

    refresh_threads = []  # at each step's draw: rich refresh threads alive

    class Watching(BatchSampler):
        def sample(self, n):
            refresh_threads.append(sum(isinstance(t, _RefreshThread) for t in threading.enumerate()))
            return super().sample(n)

    gcfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=16)
    train_model(lambda: GPT(gcfg), Watching(_tokens(), gcfg.block_size, 0), None, _cfg(max_iters=5), progress=True)
    assert refresh_threads == [0] * 5
    assert "5/5" in capsys.readouterr().out  # the last step is always drawn
