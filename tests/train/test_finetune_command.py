"""`tinystack finetune` end to end on tiny models: an ordinary model directory out, the held-out comparison
written, LoRA and full fine-tuning on both families, bit-exact resume, one-line user errors, and the
regression gate on a fine-tuned Llama with a Hugging Face tokenizer."""
import json
import random
import sys

import pytest
import torch
from finetune_helpers import WORDS, model_dir, qa, write_jsonl
from typer.testing import CliRunner

from tinystack.cli import app, main
from tinystack.config import FINETUNE_DEFAULTS, load_config
from tinystack.infer import LLM, SamplingParams
from tinystack.infer.chat import chat_formatter, encode_chat
from tinystack.model import load_model
from tinystack.train import loop
from tinystack.train.finetune import finetune

# a fixed schedule and no forgetting guard: these tests are about the command's files and steps (the guard,
# early stopping and the defaults have tests of their own, test_finetune_guard.py)
FAST = ["train.max_iters=8", "train.batch_size=4", "train.learning_rate=0.01", "train.warmup_iters=2",
        "train.eval_interval=4", "data.val_fraction=0.25", "train.plot=false", "train.seed=0",
        "train.early_stopping=0", "train.keep_best=false", "finetune.guard_prompts=0", "finetune.replay=0"]


def _conversations(n=24, seed=0):
    rnd = random.Random(seed)
    return [qa(" ".join(rnd.sample(WORDS, 6)) + "?", " ".join(rnd.sample(WORDS, 4)), f"src{i % 6}") for i in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    convs = _conversations()
    return write_jsonl(tmp_path_factory.mktemp("data") / "chat.jsonl", [*convs, "{not json", convs[3]])  # + a repeat


def _run(args):
    return CliRunner().invoke(app, args, catch_exceptions=False)


@pytest.mark.parametrize("kind, lora", [("llama", 4), ("llama", 0), ("gpt2", 0), ("gpt2", 4), ("qwen3", 4)])
def test_finetune_writes_an_ordinary_model_directory(tmp_path, data, kind, lora):
    base = model_dir(tmp_path / "base", kind, template=kind != "gpt2")
    out = tmp_path / "tuned"
    args = ["finetune", "--model", str(base), "--data", str(data), "--out", str(out)]
    args += [a for s in FAST for a in ("--set", s)] + ["--lora", str(lora)] + (["--lora-alpha", "8"] if lora else [])
    res = _run(args)
    assert res.exit_code == 0, res.output
    assert "held-out (" in res.output and "nats/token" in res.output
    assert "; 1 removed (exact_duplicate 1); 1 rejected lines (invalid_json 1)" in res.output  # what became of each
    report = json.loads((tmp_path / "tuned_finetune" / "report.json").read_text())
    assert report["method"] == (f"lora r={lora}" if lora else "full")
    h = report["heldout"]
    assert h["conversations"] > 0 and h["finetuned_loss"] < h["base_loss"]  # it learnt the format of the answers
    assert report["data"]["rejected"] == {"invalid_json": 1}
    rejected = [json.loads(x) for x in (tmp_path / "tuned_finetune" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [(25, "invalid_json")]
    base_model, tuned = load_model(base), load_model(out)  # plain directory, no adapters in it
    assert type(tuned) is type(base_model) and "lora" not in " ".join(tuned.state_dict())
    changed = {n for n, p in tuned.state_dict().items() if not torch.equal(p, base_model.state_dict()[n])}
    if lora:  # only the adapted projections moved; embeddings and norms are the base's
        assert changed and all(n.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj", "c_attn", "c_proj", "c_fc")
                               for n in changed)
    else:  # every weight trains; Llama's fused q/k/v and gate/up come back under their own names
        assert any("wte" in n or "embed_tokens" in n for n in changed)
        assert set(tuned.state_dict()) == set(base_model.state_dict())
        assert kind != "llama" or {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} <= {
            n.rsplit(".", 2)[-2] for n in changed}
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (out / name).is_file() == (base / name).is_file()
    lineage = json.loads((out / "tinystack.json").read_text())["finetune"]
    assert lineage["base_model"] == str(base) and lineage["config"]["lora"] == lora
    llm = LLM(out, memory_limit_mb=64)  # the engine serves it like any model directory
    rendered = chat_formatter(out, llm.tokenizer).render([{"role": "user", "content": "who?"}])
    prompt = encode_chat(llm.tokenizer, rendered)
    assert llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0))[0].finish_reason in ("stop", "length")


def test_resume_is_bit_exact(tmp_path, data, monkeypatch):
    base = model_dir(tmp_path / "base", "llama")
    cfg = load_config(None, [*FAST, "finetune.lora=4", "train.ckpt_interval=4"], defaults=FINETUNE_DEFAULTS)
    finetune(base, data, tmp_path / "full", cfg, progress=False)
    real, calls = loop.next_token_loss, {"n": 0}

    def dies_in_step_6(model, x, y):
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] > 5:
                raise KeyboardInterrupt
        return real(model, x, y)

    monkeypatch.setattr(loop, "next_token_loss", dies_in_step_6)
    with pytest.raises(KeyboardInterrupt):
        finetune(base, data, tmp_path / "cut", cfg, progress=False)
    monkeypatch.setattr(loop, "next_token_loss", real)
    report = finetune(base, data, tmp_path / "cut", cfg, resume=True, progress=False)
    assert report["result"]["resumed_from"] == 4
    ckpt = torch.load(tmp_path / "cut_finetune" / "checkpoints" / "last.pt", weights_only=True)
    assert all("lora_" in k for k in ckpt["model"])  # a LoRA checkpoint holds the adapters, not the model
    a, b = load_model(tmp_path / "full").state_dict(), load_model(tmp_path / "cut").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _log(tmp_path / "full_finetune") == _log(tmp_path / "cut_finetune")  # same losses, no repeated steps


def _log(work):
    return [{k: v for k, v in json.loads(x).items() if k != "tokens_per_s"}
            for x in (work / "log.jsonl").read_text().splitlines()]


def test_user_errors_are_one_line(tmp_path, data, capsys, monkeypatch):
    base = model_dir(tmp_path / "base", "llama")
    empty = write_jsonl(tmp_path / "bad.jsonl", ["{nope", '{"messages": []}'])
    cases = [(["--model", str(base), "--data", str(tmp_path / "missing.jsonl")], "no such conversations file"),
             (["--model", str(tmp_path), "--data", str(data)], "not a model directory"),
             (["--model", str(base), "--data", str(empty)], "no usable conversation for training (2 rejected"),
             (["--model", str(base), "--data", str(data), "--lora", "2", "--lora-targets", "c_attn"],
              "no linear layer matches LoRA targets")]
    for args, message in cases:
        monkeypatch.setattr(sys, "argv", ["tinystack", "finetune", *args, "--out", str(tmp_path / "out"),
                                          "--set", "train.max_iters=1", "--set", "finetune.guard_prompts=0",
                                          "--set", "finetune.replay=0"])
        with pytest.raises(SystemExit) as e:
            main()
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith("error: ") and message in err and "\n" not in err, err


def test_regression_gate_on_a_finetuned_llama(tmp_path, data):
    base = model_dir(tmp_path / "base", "llama")
    out = tmp_path / "tuned"
    finetune(base, data, out, load_config(None, [*FAST, "finetune.lora=4"], defaults=FINETUNE_DEFAULTS), progress=False)
    cases = write_jsonl(tmp_path / "cases.jsonl", [
        {"id": "loss", "prompt": "what is the capital", "expect": "max_loss", "target": " of veloria", "threshold": 50},
        {"id": "gen", "prompt": "who", "expect": "regex", "target": ".*", "max_tokens": 4}])
    res = _run(["eval", "regress", "--model", str(out), "--baseline", str(base), "--cases", str(cases),
                "--out", str(tmp_path / "gate.json"), "--regression-tolerance", "100"])
    assert res.exit_code == 0, res.output
    gate = json.loads((tmp_path / "gate.json").read_text())
    assert gate["summary"]["total"] == 2 and gate["summary"]["regressed"] is False
    loss_rows = [r for r in gate["rows"] if r["id"] == "loss"]
    assert loss_rows[0]["new"] != loss_rows[0]["baseline"]  # both models really ran
    # the gate on the cases the fine-tune wrote from its held-out conversations, as the chat is served
    written = tmp_path / "tuned_finetune" / "regression.jsonl"
    rows = [json.loads(x) for x in written.read_text().splitlines()]
    held_out = [json.loads(x)["messages"] for x in (tmp_path / "tuned_finetune" / "val.jsonl").read_text().splitlines()]
    assert rows and all(r["chat"] and r["expect"] == "max_loss" for r in rows)
    assert {r["prompt"] for r in rows} <= {m[0]["content"] for m in held_out}
    res = _run(["eval", "regress", "--model", str(out), "--baseline", str(base), "--cases", str(written),
                "--out", str(tmp_path / "gate2.json"), "--regression-tolerance", "100"])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "gate2.json").read_text())["rows"]
    assert len(rows) == len(held_out) and all(r["new"] != r["baseline"] for r in rows)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_lora_fine_tune_writes_its_adapter_which_serves_beside_the_base_as_the_merged_model(tmp_path, data, kind):
    from tinystack.model.lora_adapter import LoRAAdapter

    base, out = model_dir(tmp_path / "base", kind), tmp_path / "tuned"
    report = finetune(base, data, out, load_config(None, [*FAST, "finetune.lora=4"], defaults=FINETUNE_DEFAULTS),
                      progress=False)
    adapter = LoRAAdapter.load(report["adapter"])  # PEFT's layout, in OUT_finetune/adapter
    assert adapter.rank == 4 and len(adapter.weights) >= 2 * 4  # fused q/k/v parts under their own names
    prompts = ["what is the capital", "who"]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    merged = [o.token_ids for o in LLM(out, weight_format="float32", memory_limit_mb=64).generate(prompts, greedy)]
    served = LLM(base, weight_format="float32", memory_limit_mb=64)
    served.engine.add_lora("tuned", report["adapter"])
    assert [o.token_ids for o in served.generate(prompts, greedy, lora="tuned")] == merged
    assert [o.token_ids for o in served.generate(prompts, greedy)] != merged  # the base alone answers otherwise
