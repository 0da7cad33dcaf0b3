"""The model registry and the promotion gate: a worse model is never promoted, a better or equal one is."""
import json
import math
import multiprocessing as mp
import random
import shutil

import pytest
import torch
from registry_race import add_versions
from typer.testing import CliRunner

from tinystack.eval.case_sets import build_cases, calibrate
from tinystack.eval.commands import models_app
from tinystack.eval.gate import run_regression
from tinystack.eval.promotion import NotPromoted, promote_if_better, regression_set, verdict
from tinystack.eval.registry import ModelRegistry, RegistryError, resolve_model
from tinystack.eval.regression import run_cases
from tinystack.model.io import load_model, save_model
from tinystack.tokenizer import BPETokenizer


def _damaged(src, out, scale: float):
    model = load_model(src)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    save_model(model, out, eos_token_id=BPETokenizer.load(src).eos_token_id)
    shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
    return out


def _heldout(toy_doc, n=6):
    rng = random.Random(3)
    return build_cases([{"text": toy_doc(rng, 4), "id": f"d{i}"} for i in range(12)], n, threshold=math.log(300))


def _gate(registry, name, model_dir, heldout, tmp_path):
    cases, baseline, _ = regression_set(registry, name, heldout, ["the big cat", "the old"], gen_max_tokens=12)
    result = run_regression(model_dir, cases, baseline, tolerance=0.05)
    return result, cases


def test_registry_versions_promotion_history_and_rollback(toy_model_dir, tmp_path):
    reg = ModelRegistry(tmp_path / "reg")
    assert reg.names() == [] and reg.current("m") is None
    v1 = reg.add("m", toy_model_dir, {"note": "first"})
    assert v1 == "v1" and reg.current("m") is None  # added is not promoted
    reg.promote("m", v1)
    v2 = reg.add("m", toy_model_dir, {"note": "second"})
    reg.promote("m", v2)
    assert reg.current("m") == "v2" and reg.index("m")["promotions"] == ["v1", "v2"]
    rec = reg.record("m")
    assert rec["note"] == "second" and rec["version"] == "v2" and len(rec["model_sha256"]) == 64
    # the registry holds its own copy: the source may go away
    assert (reg.model_dir("m") / "model.safetensors").read_bytes() == (toy_model_dir / "model.safetensors").read_bytes()
    assert resolve_model("registry:m", reg.root) == reg.model_dir("m", "v2")
    assert resolve_model("registry:m@v1", reg.root) == reg.model_dir("m", "v1")
    assert resolve_model(str(toy_model_dir), reg.root) == toy_model_dir
    assert reg.rollback("m") == "v1" and reg.current("m") == "v1"
    with pytest.raises(RegistryError, match="nothing to roll back"):
        reg.rollback("m")
    with pytest.raises(RegistryError, match="no version 'v9'"):
        reg.promote("m", "v9")
    with pytest.raises(RegistryError, match="no promoted model named 'other'"):
        resolve_model("registry:other", reg.root)
    with pytest.raises(RegistryError, match="bad model name"):
        reg.current("../escape")


def test_concurrent_adds_never_lose_or_reuse_a_version(toy_model_dir, tmp_path):
    with mp.get_context("spawn").Pool(4) as pool:  # one pool (a worker's start is an import): each trial races afresh
        for trial in range(3):
            root = tmp_path / f"reg{trial}"
            got = [v for vs in pool.map(add_versions, [(root, toy_model_dir, 5)] * 4, chunksize=1) for v in vs]
            assert sorted(got, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(1, 21)]
            assert ModelRegistry(root).versions("race") == [f"v{i}" for i in range(1, 21)]
            assert ModelRegistry(root).index("race")["next"] == 21


def test_first_model_is_promoted_then_a_damaged_one_is_refused(toy_model_dir, toy_rng_doc, tmp_path):
    toy_doc, _ = toy_rng_doc
    reg, heldout = ModelRegistry(tmp_path / "reg"), _heldout(toy_doc)
    result, cases = _gate(reg, "toy", toy_model_dir, heldout, tmp_path)
    assert verdict(result)["promote"]
    v1 = promote_if_better(reg, "toy", toy_model_dir, result, cases, 0.05, tmp_path)
    assert reg.current("toy") == v1
    # the stored set is calibrated to v1's own scores: meaningful without ln(vocab)
    stored = [json.loads(line) for line in reg.cases_path("toy").read_text().splitlines()]
    losses = {r["id"]: r["score"] for r in result["new"]["cases"]}
    for c in stored:
        if c["expect"] == "max_loss":
            assert c["threshold"] == pytest.approx(losses[c["id"]] + 0.05, abs=1e-3)
            assert c["threshold"] < math.log(300) - 1

    damaged = _damaged(toy_model_dir, tmp_path / "damaged", 0.3)
    result, cases = _gate(reg, "toy", damaged, heldout, tmp_path)
    gate = verdict(result)
    assert not gate["promote"] and gate["failing"]
    with pytest.raises(NotPromoted, match="not promoted: toy stays at v1; regressed: "):
        promote_if_better(reg, "toy", damaged, result, cases, 0.05, tmp_path)
    assert reg.current("toy") == v1 and reg.versions("toy") == ["v1"]

    # the same weights again: nothing regressed, nothing new registered
    result, cases = _gate(reg, "toy", toy_model_dir, heldout, tmp_path)
    assert promote_if_better(reg, "toy", toy_model_dir, result, cases, 0.05, tmp_path) == v1
    assert reg.versions("toy") == ["v1"]


def test_calibrated_cases_alone_catch_a_worse_model(toy_model_dir, toy_rng_doc, tmp_path):
    toy_doc, _ = toy_rng_doc
    cases = _heldout(toy_doc)
    model, tok = load_model(toy_model_dir), BPETokenizer.load(toy_model_dir)
    calibrated = calibrate(cases, run_cases(model, tok, cases), tolerance=0.05)
    assert run_regression(toy_model_dir, calibrated)["summary"]["regressed"] is False
    slightly = _damaged(toy_model_dir, tmp_path / "slightly", 0.05)
    assert run_regression(slightly, calibrated)["summary"]["regressed"] is True


def test_models_commands(toy_model_dir, tmp_path):
    reg = ModelRegistry(tmp_path / "reg")
    reg.promote("m", reg.add("m", toy_model_dir, {}))
    reg.promote("m", reg.add("m", toy_model_dir, {}))
    runner = CliRunner()
    args = ["--registry", str(reg.root)]
    out = runner.invoke(models_app, ["list", *args])
    assert out.exit_code == 0 and "m\tcurrent v2\t2 versions" in out.output
    out = runner.invoke(models_app, ["show", "m", *args])
    assert out.exit_code == 0 and json.loads(out.output)["promotions"] == ["v1", "v2"]
    out = runner.invoke(models_app, ["rollback", "m", *args])
    assert out.exit_code == 0 and reg.current("m") == "v1"
    out = runner.invoke(models_app, ["promote", "m", "v2", *args])
    assert out.exit_code == 0 and reg.current("m") == "v2"
