"""Gradient accumulation equals the big batch; bf16 autocast trains; the numpy backend matches PyTorch."""
import json

import numpy as np
import pytest
import torch
from train_helpers import TINY, cfg, tokens

from tinystack.model import GPTConfig
from tinystack.train import BatchSampler, train
from tinystack.train.numpy_loop import train_numpy


def test_four_micro_batches_of_8_equal_one_batch_of_32():
    data = tokens()
    big, _ = train(TINY, data, None, cfg(max_iters=3, batch_size=32, dtype="float64"), progress=False)
    acc, _ = train(TINY, data, None, cfg(max_iters=3, batch_size=8, grad_accum_steps=4, dtype="float64"),
                   progress=False)
    for (n, a), (_, b) in zip(big.state_dict().items(), acc.state_dict().items()):
        assert torch.allclose(a, b, rtol=0, atol=1e-12), n
    single, _ = train(TINY, data, None, cfg(max_iters=3, batch_size=8, dtype="float64"), progress=False)
    assert not torch.equal(single.transformer.wte.weight, big.transformer.wte.weight)  # the test can fail


def test_sampler_state_resumes_the_same_windows():
    data = tokens()
    a = BatchSampler(data, 8, seed=3)
    a.sample(5)
    state = a.state_dict()
    expected = a.sample(4)
    b = BatchSampler(data, 8, seed=99)
    b.load_state_dict(state)
    got = b.sample(4)
    assert np.array_equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
    assert np.array_equal(got[0][:, 1:], got[1][:, :-1])  # y is x shifted by one


def test_bf16_autocast_on_cpu_trains():
    data = tokens()
    model, result = train(TINY, data, data, cfg(max_iters=40, dtype="bfloat16", eval_interval=40), progress=False)
    assert model.transformer.wte.weight.dtype == torch.float32  # master weights stay float32
    assert result.final_val_loss < np.log(16) * 0.8


def test_fp16_needs_cuda():
    with pytest.raises(ValueError, match="needs CUDA"):
        train(TINY, tokens(), None, cfg(dtype="float16"), progress=False)


def test_numpy_backend_matches_torch_for_10_steps_float64(tmp_path):
    data = tokens(vocab=16)
    gcfg = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    c = cfg(max_iters=10, batch_size=4, dtype="float64", grad_accum_steps=2, eval_interval=5)
    train(gcfg, data, data, c, progress=False, log_path=tmp_path / "torch.jsonl")
    train_numpy(gcfg, data, data, c, progress=False, log_path=tmp_path / "numpy.jsonl")
    t = [json.loads(x) for x in (tmp_path / "torch.jsonl").read_text().splitlines()]
    n = [json.loads(x) for x in (tmp_path / "numpy.jsonl").read_text().splitlines()]
    assert len(t) == len(n) == 10
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(t, n)) < 1e-5
    assert abs(t[-1]["val_loss"] - n[-1]["val_loss"]) < 1e-5
    assert t[-1]["loss"] < t[0]["loss"]  # it trained, so agreement is not trivial


@pytest.mark.slow
def test_torch_compile_option_gives_the_same_losses():
    data = tokens()
    c = dict(max_iters=3, eval_interval=100)
    _, eager = train(TINY, data, data, cfg(**c), progress=False)
    _, compiled = train(TINY, data, data, cfg(compile=True, **c), progress=False)
    assert compiled.final_train_loss == pytest.approx(eager.final_train_loss, abs=1e-4)
    assert compiled.final_val_loss == pytest.approx(eager.final_val_loss, abs=1e-4)
