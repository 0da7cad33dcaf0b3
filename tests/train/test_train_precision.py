"""train.dtype=auto: float32 vs bf16 autocast chosen by timing at start, loss checked, no trace on the run;
attention stays float32 under CPU autocast where the bf16 path does not serve."""
import time

import numpy as np
import pytest
import torch
from train_helpers import TINY, cfg, tokens

from tinystack.config import load_config
from tinystack.kernels import fused_attention
from tinystack.model import GPTConfig
from tinystack.model.attention import causal_attention
from tinystack.model.gpt import GPT
from tinystack.train import precision, train
from tinystack.train.numpy_loop import train_numpy


def fake_step(ms: dict[str, float], loss: dict[str, float], calls: list[str] | None = None):
    """A run_step whose duration and loss per dtype are set by the test: the choice must follow them."""
    def run(dtype: str) -> float:
        if calls is not None:
            calls.append(dtype)
        time.sleep(ms[dtype] / 1e3)
        return loss[dtype]
    return run


@pytest.mark.parametrize("trial", range(5))  # sleeps under load: repeated so a flaky choice would show
def test_auto_picks_the_faster_dtype_by_measurement(trial):
    same = {"float32": 4.2, "bfloat16": 4.201}
    assert precision.pick_by_measurement(fake_step({"float32": 30, "bfloat16": 2}, same))[0] == "bfloat16"
    chosen, record = precision.pick_by_measurement(fake_step({"float32": 2, "bfloat16": 30}, same))
    assert chosen == "float32"
    assert record["ms_per_step"]["bfloat16"] > record["ms_per_step"]["float32"] >= 2.0
    assert record["chosen"] == "float32" and record["loss_agrees"]["bfloat16"]


def test_auto_keeps_float32_when_the_loss_disagrees_or_bf16_fails():
    chosen, record = precision.pick_by_measurement(fake_step({"float32": 20, "bfloat16": 1},
                                                             {"float32": 4.2, "bfloat16": 4.5}))
    assert chosen == "float32" and record["loss_agrees"] == {"float32": True, "bfloat16": False}

    def no_bf16(dtype: str) -> float:
        if dtype == "bfloat16":
            raise RuntimeError("bf16 not supported here")
        return 4.2
    chosen, record = precision.pick_by_measurement(no_bf16)
    assert chosen == "float32" and "bf16 not supported" in record["failed"]["bfloat16"]


def test_auto_timing_is_interleaved_after_a_warm_up():
    calls: list[str] = []
    precision.pick_by_measurement(fake_step({"float32": 0, "bfloat16": 0}, {"float32": 1, "bfloat16": 1}, calls),
                                  rounds=3)
    assert calls == ["float32", "bfloat16"] * 4  # one warm-up pass each, then 3 alternating rounds


def test_a_candidate_whose_screen_product_is_far_slower_runs_no_step():
    """Where bf16 has no instructions (AVX2-only CPUs) one bf16 pass of a real model takes minutes: the screen
    drops it on one product's time; a candidate within SCREEN_SLOWER still gets the whole-step comparison."""
    calls: list[str] = []
    same = {"float32": 4.2, "bfloat16": 4.2}
    slow_bf16 = fake_step({"float32": 1, "bfloat16": 10}, same)
    chosen, record = precision.pick_by_measurement(fake_step({"float32": 5, "bfloat16": 1}, same, calls),
                                                   screen=slow_bf16)
    assert chosen == "float32" and calls == ["float32"] * 6  # warm-up + 5 rounds, never bf16
    assert record["screened_out"]["bfloat16"] > precision.SCREEN_SLOWER and "bfloat16" not in record["ms_per_step"]
    assert "bfloat16 dropped" in precision.describe(record)

    calls.clear()
    close = fake_step({"float32": 2, "bfloat16": 3}, same)  # 1.5x slower in the screen: still measured whole
    chosen, record = precision.pick_by_measurement(fake_step({"float32": 30, "bfloat16": 2}, same, calls),
                                                   screen=close)
    assert chosen == "bfloat16" and calls.count("bfloat16") == 6 and "screened_out" not in record


def test_the_screen_times_one_of_the_models_own_products_in_each_dtype(monkeypatch):
    seen: list = []
    real = precision.pick_by_measurement

    def spy(run_step, rounds=5, screen=None):
        seen.append(screen)
        return real(run_step, rounds=1, screen=screen)
    monkeypatch.setattr(precision, "pick_by_measurement", spy)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 32, (2, 16))
    chosen, record = precision.probe(model, x, x, lambda m, a, b: m(a, b)[1])
    assert seen[0] is not None and chosen in precision.AUTO_CANDIDATES
    assert seen[0]("float32").dtype == torch.float32 and seen[0]("bfloat16").dtype == torch.bfloat16
    # the median-size weight (c_attn's [3 n_embd, n_embd]: not the head, not the smallest) over the batch's 32
    # tokens (fewer than SCREEN_ROWS)
    assert seen[0]("float32").shape == (32, 3 * 32)
    assert set(record["ms_per_step"]) | set(record.get("screened_out", {})) == set(precision.AUTO_CANDIDATES)


def test_auto_trains_exactly_as_the_dtype_it_chose():
    """The probe leaves no trace: same weights, data position and RNG as a run configured with its choice."""
    data = tokens()
    c = cfg(max_iters=15, eval_interval=15)
    auto_model, auto = train(TINY, data, data, cfg(max_iters=15, eval_interval=15, dtype="auto"), progress=False)
    assert auto.dtype in precision.AUTO_CANDIDATES and auto.precision_probe["chosen"] == auto.dtype
    measured = set(auto.precision_probe["ms_per_step"]) | set(auto.precision_probe.get("screened_out", {}))
    assert measured == {"float32", "bfloat16"} and auto.precision_probe["probe_s"] > 0
    c.dtype = auto.dtype
    fixed_model, fixed = train(TINY, data, data, c, progress=False)
    for (name, a), (_, b) in zip(auto_model.state_dict().items(), fixed_model.state_dict().items()):
        assert torch.equal(a, b), name
    assert fixed.precision_probe is None and fixed.dtype == auto.dtype


@pytest.mark.parametrize("dtype", precision.AUTO_CANDIDATES)
def test_both_candidates_train(dtype):
    data = tokens()
    model, result = train(TINY, data, data, cfg(max_iters=40, dtype=dtype, eval_interval=40),
                          progress=False)
    assert result.dtype == dtype and result.final_val_loss < np.log(16) * 0.8


def test_resume_keeps_the_precision_auto_chose(tmp_path, monkeypatch):
    data = tokens()
    _, first = train(TINY, data, None, cfg(max_iters=10, dtype="auto"), progress=False, ckpt_dir=tmp_path)

    def must_not_probe(*args, **kwargs):
        raise AssertionError("a resume must reuse the checkpoint's precision, not measure again")
    monkeypatch.setattr(precision, "probe", must_not_probe)
    _, resumed = train(TINY, data, None, cfg(max_iters=20, dtype="auto"), progress=False, ckpt_dir=tmp_path,
                       resume=True)
    assert resumed.resumed_from == 10 and resumed.dtype == first.dtype


def test_attention_runs_in_float32_under_cpu_autocast_and_matches(monkeypatch):
    # where kernels/fused_attention's bf16 path does not serve (measured slower, too long, no compiler): flash
    # attention in float32 (the bf16 path has its own tests: tests/model/test_fused_attention.py)
    monkeypatch.setattr(fused_attention, "serves", lambda q, k: False)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    ref = causal_attention(q, k, v, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0)
    assert got.dtype == torch.float32
    assert torch.allclose(got, ref, atol=3e-2)  # only the bf16 rounding of q, k, v
    got.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_gpt_bf16_autocast_logits_agree_with_float32():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    x = torch.randint(0, 32, (3, 16))
    ref, _ = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = model(x)
    assert (got.float() - ref).abs().max() < 5e-2


def test_auto_is_a_config_value_and_the_numpy_backend_reads_it_as_float32(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[train]\ndtype = "auto"\n')
    assert load_config(toml, []).train.dtype == "auto"
    with pytest.raises(Exception, match="dtype"):
        load_config(toml, ["train.dtype=bf16"])
    model, _ = train_numpy(TINY, tokens(), None, cfg(max_iters=2, dtype="auto"), progress=False)
    assert {p.dtype for p in model.parameters().values()} == {np.dtype(np.float32)}
