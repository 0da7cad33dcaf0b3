"""Checkpoints: 10 steps + resume + 10 steps == 20 steps bit for bit; last/best kept; a non-finite loss keeps them."""
import json

import pytest
import torch
from train_helpers import TINY, cfg, tokens

from tinystack.train import NonFiniteLossError, load_checkpoint, train
from tinystack.train import loss as train_loss  # its cross_entropy is the training loss (lm_loss)


def _params(model):
    return {n: p.detach().clone() for n, p in model.state_dict().items()}


def test_resume_is_bit_exact(tmp_path):
    data = tokens()
    full, _ = train(TINY, data, data, cfg(max_iters=20), progress=False, log_path=tmp_path / "full.jsonl")
    # a 20-step run (checkpoints every 5 steps) killed during its 11th step, then resumed for the other 10
    stop_at_10 = tmp_path / "ck20"
    with pytest.raises(KeyboardInterrupt):
        _train_until(data, stop_at_10, tmp_path / "resumed.jsonl", stop_step=10)
    ckpt = load_checkpoint(stop_at_10 / "last.pt")
    assert ckpt["step"] == 10 and ckpt["data"]["windows_drawn"] == 10 * 4 and ckpt["scheduler"]["step"] == 10
    resumed, result = train(TINY, data, data, cfg(max_iters=20, ckpt_interval=5), progress=False,
                            ckpt_dir=stop_at_10, resume=True, log_path=tmp_path / "resumed.jsonl")
    assert result.resumed_from == 10
    a, b = _params(full), _params(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)
    full_log = (tmp_path / "full.jsonl").read_text().splitlines()
    resumed_log = (tmp_path / "resumed.jsonl").read_text().splitlines()
    strip = lambda lines: [{k: v for k, v in json.loads(x).items() if k != "tokens_per_s"} for x in lines]  # noqa: E731
    assert strip(full_log) == strip(resumed_log)  # same losses, lr, val losses; no duplicate steps


def _train_until(data, ckpt_dir, log_path, stop_step):
    """Run a 20-step training with checkpoints every 5 steps and kill it (KeyboardInterrupt) during step `stop_step`."""
    calls = {"n": 0}
    real = train_loss.cross_entropy

    def interrupting(*args, **kwargs):
        if torch.is_grad_enabled():  # training forward passes only, not val estimates
            calls["n"] += 1
            if calls["n"] > stop_step:
                raise KeyboardInterrupt
        return real(*args, **kwargs)

    train_loss.cross_entropy = interrupting
    try:
        train(TINY, data, data, cfg(max_iters=20, ckpt_interval=5), progress=False, ckpt_dir=ckpt_dir,
              log_path=log_path)
    finally:
        train_loss.cross_entropy = real


def test_keeps_last_and_best(tmp_path):
    data = tokens()
    train(TINY, data, data, cfg(max_iters=12, ckpt_interval=4, eval_interval=4), progress=False, ckpt_dir=tmp_path)
    last, best = load_checkpoint(tmp_path / "last.pt"), load_checkpoint(tmp_path / "best.pt")
    assert last["step"] == 12
    assert best["val_loss"] == best["best_val_loss"] == last["best_val_loss"]
    assert {k for k in last} >= {"model", "optimizer", "scaler", "scheduler", "data", "rng", "step"}


def test_non_finite_loss_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    data = tokens()
    real, calls = train_loss.cross_entropy, {"n": 0}

    def nan_after_7(*args, **kwargs):
        out = real(*args, **kwargs)
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] > 7:
                return out * float("nan")
        return out

    monkeypatch.setattr(train_loss, "cross_entropy", nan_after_7)
    with pytest.raises(NonFiniteLossError, match="at step 7"):
        train(TINY, data, None, cfg(max_iters=20, ckpt_interval=3), progress=False, ckpt_dir=tmp_path)
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt["step"] == 6  # written after step index 5; step 7 failed before anything else was written
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    monkeypatch.setattr(train_loss, "cross_entropy", real)
    _, result = train(TINY, data, None, cfg(max_iters=20, ckpt_interval=3), progress=False, ckpt_dir=tmp_path,
                      resume=True)  # and it is a usable checkpoint
    assert result.resumed_from == 6 and result.final_train_loss == result.final_train_loss


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(TINY, tokens(), None, cfg(), progress=False, ckpt_dir=tmp_path, resume=True)
