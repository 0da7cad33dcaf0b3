"""dtype="auto": the fastest format within the perplexity bounds, measured once per (model, CPU, torch)."""
from __future__ import annotations

import pytest
import torch

from tinystack.config import InferConfig
from tinystack.infer.loading import load_for_inference
from tinystack.infer.quant import auto
from tinystack.infer.quant.linear import QuantEmbedding, QuantLinear, head_format
from tinystack.kernels import cpu
from tinystack.model import GPT, GPTConfig, save_model
from tinystack.tokenizer import BPETokenizer

TEXT = ["The river town woke slowly. def largest(values): return max(values)\n"] * 30


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("auto")
    tok = BPETokenizer.train(TEXT, vocab_size=320)
    tok.save(d)
    torch.manual_seed(7)
    save_model(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=96, n_layer=2, n_head=2, n_embd=64)), d,
               eos_token_id=tok.eos_token_id)
    return d


def test_pick_is_the_fastest_format_within_its_bound():
    ms = {"fp32": 10.0, "bf16": 6.0, "q8_0": 4.0, "q4_0": 2.0, "q4_1": 2.5}
    ppl = {"fp32": 10.0, "bf16": 10.05, "q8_0": 10.2, "q4_0": 10.6, "q4_1": 10.4}
    assert auto.pick(ms, ppl) == "q4_1"  # q4_0 is faster but +6 % > 5 %
    assert auto.pick(ms, {**ppl, "q4_1": 11.0}) == "bf16"  # q8_0's +2 % is over its 1 % bound
    assert auto.pick(ms, {"fp32": 10.0}) == "fp32"  # nothing else scored: float32 always qualifies
    assert auto.pick({**ms, "fp32": 1.0}, ppl) == "fp32"
    # far below float32's is as far: the quantised model is another model (a fine-tune rounded back to its base)
    assert auto.pick(ms, {**ppl, "q4_0": 8.5, "q4_1": 9.4}) == "bf16"  # -15 %, -6 %: out; q8_0 +2 %: out
    assert auto.pick(ms, {**ppl, "q4_1": 9.6}) == "q4_1"  # -4 %: within 5 %


def test_measure_scores_fastest_first_and_stops_at_the_first_accurate_one(model_dir):
    from tinystack.model import load_model
    from tinystack.tokenizer import load_tokenizer

    model = load_model(model_dir)
    ids = auto.calibration_ids(load_tokenizer(model_dir), model.config.block_size)
    assert 20 < len(ids) <= model.config.block_size
    full = auto.measure(model, ids, score_all=True)
    assert set(full.ms) == set(full.ppl) == set(auto.CANDIDATES)
    assert all(0 <= a <= 1 for a in full.agreement.values()) and full.agreement["fp32"] == 1
    assert full.format == auto.pick(full.ms, full.ppl)
    lazy = auto.measure(model, ids)
    assert lazy.format in lazy.ppl
    assert abs(lazy.ppl[lazy.format] / lazy.ppl["fp32"] - 1) <= auto.PPL_BOUNDS[lazy.format]
    faster = [f for f in lazy.ms if lazy.ms[f] < lazy.ms[lazy.format]]
    assert all(f in lazy.ppl for f in faster)  # every faster candidate was scored (and failed)
    assert isinstance(model.lm_head, torch.nn.Linear)  # the float model itself is untouched


def test_the_decision_is_cached_per_model_cpu_and_torch(model_dir, tmp_path, monkeypatch):
    from tinystack.model import load_model
    from tinystack.tokenizer import load_tokenizer

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    lines = []
    first = auto.choose_format(model, model_dir, tok, cache_dir=tmp_path, log=lines.append)
    assert not first.cached and (tmp_path / "weight_formats.json").is_file()
    assert lines[-1].startswith(f"weight_format=auto -> {first.format}:") and "ppl" in lines[-1]

    def must_not_measure(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(auto, "measure", must_not_measure)
    again = auto.choose_format(model, model_dir, tok, cache_dir=tmp_path, log=lines.append)
    assert again.cached and again.format == first.format and again.ms == first.ms
    assert "cached decision" in lines[-1]
    monkeypatch.setattr(cpu, "identity", lambda: "another CPU")  # another machine measures again
    with pytest.raises(AssertionError, match="measured again"):
        auto.choose_format(model, model_dir, tok, cache_dir=tmp_path, log=lines.append)


def test_fingerprint_follows_the_weights(model_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert auto.model_fingerprint(copy) == auto.model_fingerprint(model_dir)
    torch.manual_seed(8)
    save_model(GPT(GPTConfig(vocab_size=320, block_size=96, n_layer=2, n_head=2, n_embd=64)), copy)
    assert auto.model_fingerprint(copy) != auto.model_fingerprint(model_dir)


def test_load_for_inference_auto_and_explicit_overrides(model_dir, weight_format_cache):
    model, tok = load_for_inference(model_dir)  # weight_format="auto"
    choice = auto.choose_format(model, model_dir, tok, log=lambda line: None)  # the cached decision
    assert choice.cached
    kinds = {m.fmt for m in model.modules() if isinstance(m, QuantLinear)}
    assert kinds == (set() if choice.format == "fp32" else {choice.format, head_format(choice.format)})
    plain, _ = load_for_inference(model_dir, InferConfig(weight_format="float32"))
    assert not any(isinstance(m, QuantLinear) for m in plain.modules())
    q4, _ = load_for_inference(model_dir, InferConfig(weight_format="q4_0"))
    fmts = {name: m.fmt for name, m in q4.named_modules() if isinstance(m, QuantLinear)}
    assert fmts.pop("lm_head") == "q8_0" and set(fmts.values()) == {"q4_0"}
    assert isinstance(q4.transformer.wte, QuantEmbedding)
    q8, _ = load_for_inference(model_dir, InferConfig(weight_format="q8_0"))
    assert {m.fmt for m in q8.modules() if isinstance(m, QuantLinear)} == {"q8_0"}
    for bad in ("int3", "fp8", "int8"):  # int8 was another name for q8_0: one name per format now
        with pytest.raises(ValueError, match="infer.weight_format: expected one of 'auto', 'float32'"):
            InferConfig(weight_format=bad)
