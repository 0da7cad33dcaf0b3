"""`tinystack run --config configs/smoke.toml` end to end, through the real server, then a re-run that reuses stages.

The smoke run itself is a real process with only the core dependencies importable (as `make demo` installs it);
the commands after it run in-process through the CLI's main() (conftest.run_cli)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.toml"
CORE_ONLY = Path(__file__).with_name("core_only.py")
NAME = "tinystack-smoke"  # smoke.toml's run.name: smoke models have their own line in the registry


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The smoke demo as `make demo` installs it: only the core dependencies importable (core_only.py), every
    stage real, SmolLM2's import and its served chat answer included."""
    workdir = tmp_path_factory.mktemp("run")
    proc = subprocess.run([sys.executable, str(CORE_ONLY), "tinystack", "run", "--config", str(SMOKE),
                           "--workdir", str(workdir), "--registry", str(workdir / "registry")],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir, proc


def test_pipeline_leaves_every_artifact_with_consistent_lineage(smoke_run):
    workdir, proc = smoke_run
    manifest = json.loads((workdir / "data" / "manifest.json").read_text())
    lineage = json.loads((workdir / "model" / "tinystack.json").read_text())
    stages = json.loads((workdir / "stages.json").read_text())
    assert lineage["data_manifest_hash"] == manifest["hash"]
    assert lineage["tokenizer_hash"] == stages["tokenizer"]["info"]["fingerprint"]
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (workdir / "model" / name).is_file()
    evaluation = json.loads((workdir / "eval.json").read_text())
    vocab = json.loads((workdir / "model" / "config.json").read_text())["vocab_size"]
    # the model learned something: far better than a uniform guess over the vocabulary
    assert evaluation["val"]["loss"] < math.log(vocab) - 1.0
    assert lineage["metrics"]["val"]["loss"] == evaluation["val"]["loss"]
    assert "done." in proc.stdout


def test_demo_requests_were_served_and_logged(smoke_run):
    workdir, proc = smoke_run
    lines = [json.loads(line) for line in (workdir / "logs" / "requests.jsonl").read_text().splitlines()]
    requests = [r for r in lines if r.get("status") == 200]
    assert len(requests) == 4  # the four demo prompts of the default [run] section
    assert "server up at http://127.0.0.1:" in proc.stdout
    assert "total ms" in proc.stdout


def test_the_pretrained_model_was_imported_and_answered_a_chat(smoke_run):
    workdir, proc = smoke_run
    stages = json.loads((workdir / "stages.json").read_text())
    assert stages["pretrained"]["info"]["source"] == "smollm2-135m-instruct"
    lines = [json.loads(line) for line in (workdir / "logs" / "chat_requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines] == [200]  # smoke.toml asks one question
    assert lines[0]["completion_tokens"] > 0
    assert "chat requests (POST /v1/chat/completions" in proc.stdout


def test_a_missing_pretrained_model_fails_before_anything_runs(tmp_path, run_cli):
    proc = run_cli("run", "--config", SMOKE, "--workdir", tmp_path / "w", "--set",
                   f"run.pretrained={tmp_path / 'absent.gguf'}")
    assert proc.returncode == 2 and "error: run.pretrained:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "w" / "data").exists()  # refused before the first stage, not after training


def test_rerun_reuses_every_stage(smoke_run, run_cli):
    workdir, _ = smoke_run
    proc = run_cli("run", "--config", str(SMOKE), "--workdir", str(workdir), "--no-serve", "--registry",
                str(workdir / "registry"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for stage in ("corpus", "data", "tokenizer", "train", "eval"):
        assert f"{stage}: up to date" in proc.stdout


@pytest.mark.parametrize("args, msg", [
    (["run", "--config", "missing.toml"], "config file not found"),
    (["run", "--set", "train.max_itres=3"], "unknown key train.max_itres"),
])
def test_user_errors_exit_2_with_one_line(args, msg, run_cli):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert msg in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # every stage again by hand through the CLI (in-process): ~15 s on 2 CPU cores
def test_each_stage_runs_by_hand_with_the_same_results(smoke_run, tmp_path, run_cli):
    """The subcommands chain like `tinystack run`: corpus -> prepare -> tokenizer -> train -> eval -> generate."""
    workdir, _ = smoke_run
    small = ["--config", str(SMOKE), "--set", "train.max_iters=20"]
    steps = [
        ["data", "corpus", "--out", str(tmp_path / "c.jsonl"), "--corpus-max-docs", "3000"],
        ["data", "prepare", "--input", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "data"), *small],
        ["tokenizer", "train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "tok"), *small],
        ["train", "--tokens", str(tmp_path / "tok"), "--out", str(tmp_path / "model"), *small],
        ["eval", "--model", str(tmp_path / "model"), "--tokens", str(tmp_path / "tok"), "--out",
         str(tmp_path / "eval.json"), *small],
    ]
    for args in steps:
        proc = run_cli(*args)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
    # same config + same corpus -> the same split and tokenizer as the pipeline's
    assert (tmp_path / "data" / "train.jsonl").read_bytes() == (workdir / "data" / "train.jsonl").read_bytes()
    assert (tmp_path / "tok" / "tokenizer.json").read_bytes() == (workdir / "tokenizer" / "tokenizer.json").read_bytes()
    assert json.loads((tmp_path / "eval.json").read_text())["val"]["tokens"] > 0
    # lineage is complete however the model was trained: `tinystack train` by hand records the data it came from
    lineage = json.loads((tmp_path / "model" / "tinystack.json").read_text())
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert lineage["data_manifest_hash"] == manifest["hash"]
    stages = json.loads((workdir / "stages.json").read_text())
    assert lineage["tokenizer_hash"] == stages["tokenizer"]["info"]["fingerprint"]

    proc = run_cli("generate", "--model", str(workdir / "model"), "--prompt", "Return the", "--temperature", "0",
                "--max-tokens", "5")
    assert proc.returncode == 0 and proc.stdout.startswith("Return the")
    assert "finish_reason=" in proc.stderr
    proc = run_cli("bench", "kv", "--model", str(workdir / "model"), "--prompt-tokens", "16", "--new-tokens", "16")
    assert proc.returncode == 0 and json.loads(proc.stdout)["same_tokens"] is True


def test_the_run_promotes_its_model_and_refuses_a_worse_one(smoke_run, tmp_path, run_cli):
    """The first run promoted its model; a run that trains far less is gated against it and not promoted."""
    workdir, proc = smoke_run
    registry = workdir / "registry"
    index = json.loads((registry / NAME / "index.json").read_text())
    assert index["current"] == "v1" and "promoted" in proc.stdout
    record = json.loads((registry / NAME / "v1" / "record.json").read_text())
    lineage = json.loads((workdir / "model" / "tinystack.json").read_text())
    assert record["data_manifest_hash"] == lineage["data_manifest_hash"]
    assert record["metrics"]["val"]["loss"] == lineage["metrics"]["val"]["loss"]

    worse = run_cli("run", "--config", str(SMOKE), "--workdir", str(tmp_path / "worse"), "--no-serve",
                 "--registry", str(registry), "--set", "train.max_iters=40")
    assert worse.returncode == 1, worse.stdout[-2000:] + worse.stderr[-2000:]
    assert f"not promoted: {NAME} stays at v1; regressed:" in worse.stderr
    assert "Traceback" not in worse.stderr
    assert json.loads((registry / NAME / "index.json").read_text())["current"] == "v1"
    gate = json.loads((tmp_path / "worse" / "regression.json").read_text())["gate"]
    assert gate["baseline_version"] == "v1" and not gate["promote"]
