"""Fine-tuning without forgetting: the guard's scores (eval/retention.py) against their references, early
stopping with the best weights kept, the schedule the defaults derive from the data, a forgetting fine-tune
stopped with one line and written as rejected (never promotable), --allow-forgetting, replay, and bad input
refused before anything is written. Tiny models: SmolLM2 at the defaults is tests/train/test_finetune_planted.py
and benchmarks/bench_finetune_quality.py."""
import json
import random
import sys

import numpy as np
import pytest
import torch
from finetune_helpers import WORDS, model_dir, qa, write_jsonl

from tinystack.cli import main
from tinystack.config import FINETUNE_DEFAULTS, FinetuneConfig, TrainConfig, load_config
from tinystack.eval import retention as R
from tinystack.eval.registry import ModelRegistry, RegistryError
from tinystack.eval.scoring import target_nats
from tinystack.infer.chat import chat_formatter
from tinystack.model import GPT, GPTConfig, load_model
from tinystack.tokenizer import load_tokenizer
from tinystack.train import loop
from tinystack.train.batches import BatchSampler
from tinystack.train.finetune import FULL_LR, LORA_LR, finetune, schedule


def _conversations(n=24, seed=0, sources=6, answer=None):
    """`answer`: every conversation answers the same (narrow data that overwrites what the model said before)."""
    rnd = random.Random(seed)
    return [qa(" ".join(rnd.sample(WORDS, 6)) + "?", answer or " ".join(rnd.sample(WORDS, 4)), f"src{i % sources}")
            for i in range(n)]


KNOWN = list(zip(WORDS[20:26], WORDS[30:36]))  # (subject, answer): what the "base" below was taught


def _guard_file(tmp_path):
    rows = [{"prompt": f"what is {a}?", "answer": b} for a, b in KNOWN]
    return write_jsonl(tmp_path / "general.jsonl", rows + [{"prompt": "tell me a story"}])


@pytest.fixture(scope="module")
def knowing_base(tmp_path_factory):
    """A tiny Llama fully fine-tuned until it answers KNOWN confidently (a random model knows nothing to
    forget): "what is france?" -> "one", ..."""
    tmp = tmp_path_factory.mktemp("knowing")
    rows = [qa(f"{form} {a}?", b, f"form{i}") for i, form in enumerate(["what is", "tell me", "say", "name"])
            for a, b in KNOWN]
    cfg = load_config(None, ["finetune.lora=0", "train.max_iters=40", "train.batch_size=6", "train.learning_rate=0.01",
                             "train.warmup_iters=0", "train.eval_interval=40", "data.val_fraction=0.25",
                             "train.plot=false", "finetune.guard_prompts=0", "train.early_stopping=0",
                             "finetune.replay=0"],
                      defaults=FINETUNE_DEFAULTS)
    finetune(model_dir(tmp / "random", "llama"), write_jsonl(tmp / "known.jsonl", rows), tmp / "base", cfg,
             progress=False)
    return tmp / "base"


def test_builtin_prompts_cover_the_kinds_and_replay_never_repeats_them():
    guard, replay = R.general_prompts(100), R.replay_prompts(100)
    kinds = {p.kind for p in guard}
    assert len(guard) == 100 and {"fact", "arithmetic", "instruction", "code"} <= kinds
    assert sum(p.answer is not None for p in guard) >= 40  # the factual ones carry their short answer
    assert {p.prompt.lower() for p in guard}.isdisjoint(p.prompt.lower() for p in replay)
    small = R.general_prompts(8)  # a small guard is spread over the kinds, not the first kind only
    assert {p.kind for p in small} == kinds
    with pytest.raises(ValueError, match="finetune.replay: at most 100"):
        R.replay_prompts(101)


def test_a_users_general_file_is_added_and_a_bad_line_named(tmp_path):
    own = R.general_prompts(0, _guard_file(tmp_path))
    assert len(own) == 7 and own[0].answer == KNOWN[0][1] and own[-1].answer is None
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"answer": "x"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected"):
        R.general_prompts(0, bad)


def test_answered_matches_whole_words_only():
    assert R.answered("The capital of France is Paris.", "paris")
    assert R.answered("2 + 3 = 5", "5") and not R.answered("2 + 3 = 15", "5")
    assert not R.answered("A Parisian cafe", "Paris")


def test_answer_nll_equals_target_nats_one_answer_at_a_time(tmp_path):
    base = model_dir(tmp_path / "m", "llama")
    model, tok = load_model(base).eval(), load_tokenizer(base)
    fmt = chat_formatter(base, tok)
    prompts = R.general_prompts(0, _guard_file(tmp_path))
    rnd = random.Random(1)
    ids = [[rnd.randrange(1, 200) for _ in range(rnd.randrange(1, 9))] for _ in prompts]
    rec = R.Recorded(prompts, [""] * len(prompts), ids, [True] * len(prompts))
    reference = np.concatenate([target_nats(model, R._chat_ids(tok, fmt, p.prompt), a) for p, a in zip(prompts, ids)])
    assert R.answer_nll(model, tok, fmt, rec, batch_size=3) == pytest.approx(float(reference.mean()), abs=1e-5)


def test_retention_verdict_names_what_was_lost():
    prompts = [R.GeneralPrompt(f"f{i}", "fact", f"q{i}", a) for i, a in enumerate(["Paris", "Tokyo", "7", "blue"])]
    base = R.Recorded([*prompts, R.GeneralPrompt("o", "instruction", "poem")],
                      ["It is Paris.", "Tokyo.", "I think 8.", "Blue!", "roses"], [[1]] * 5, [True] * 5)
    kept = R.retention(base, ["Paris", "Tokyo", "9", "blue"], 1.0, 1.2, max_retention_nll=0.5, min_fact_retention=0.95)
    assert kept["passed"] and kept["facts_base_right"] == 3 and kept["fact_retention"] == 1.0  # "7" was wrong before
    lost = R.retention(base, ["Paris", "Kyoto", "7", "blue"], 1.0, 1.7, max_retention_nll=0.5, min_fact_retention=0.95)
    assert not lost["passed"] and lost["lost"] == ["f1"] and lost["fact_retention"] == pytest.approx(2 / 3)
    assert len(lost["reasons"]) == 2 and "0.70 nats/token" in lost["reasons"][0]


def test_schedule_fills_the_defaults_from_the_data():
    t = load_config(None, [], defaults=FINETUNE_DEFAULTS).train
    lora = schedule(t, FinetuneConfig(lora=16, epochs=3), 50)  # 7 batches of 8 an epoch
    assert (lora.max_iters, lora.learning_rate, lora.min_lr, lora.eval_interval) == (21, LORA_LR, LORA_LR / 10, 3)
    full = schedule(t, FinetuneConfig(lora=0, epochs=1), 8)
    assert (full.max_iters, full.learning_rate, full.eval_interval, full.warmup_iters) == (1, FULL_LR, 1, 0)
    mine = schedule(TrainConfig(max_iters=5, learning_rate=1e-3, min_lr=1e-5, eval_interval=2), FinetuneConfig(), 50)
    assert (mine.max_iters, mine.learning_rate, mine.min_lr, mine.eval_interval) == (5, 1e-3, 1e-5, 2)


def test_early_stopping_ends_the_run_and_keeps_the_best_weights(monkeypatch):
    """Scripted held-out losses 3, 2, 2.5, 2.6: best at the 2nd evaluation, 2 worse ones -> stop at step 8 of 20,
    with the weights of step 4."""
    losses, seen = iter([3.0, 2.0, 2.5, 2.6]), {}

    class Score:
        def __init__(self, loss):
            self.loss = loss

    def scripted(model, batches, device="cpu"):
        step = len(seen) * 2 + 2
        seen[step] = {n: p.detach().clone() for n, p in model.named_parameters()}
        return Score(next(losses))

    monkeypatch.setattr(loop, "score_batches", scripted)
    tokens = np.random.default_rng(0).integers(0, 32, 4096).astype(np.uint16)
    cfg = TrainConfig(max_iters=20, batch_size=4, eval_interval=2, early_stopping=2, keep_best=True, warmup_iters=0,
                      learning_rate=1e-2, plot=False, keep_freed_memory=False)
    gcfg = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)
    model, result = loop.train_model(lambda: GPT(gcfg), BatchSampler(tokens, 16, 0), [(None, None)], cfg,
                                     progress=False)
    assert result.stopped_early and result.steps == 8 and result.best_step == 4 and result.best_val_loss == 2.0
    assert all(torch.equal(p, seen[4][n]) for n, p in model.named_parameters())
    assert not all(torch.equal(p, seen[8][n]) for n, p in model.named_parameters())


def _cli(monkeypatch, capsys, *args, command="finetune"):
    monkeypatch.setattr(sys, "argv", ["tinystack", *command.split(), *map(str, args)])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, capsys.readouterr()


GUARDED = ["train.max_iters=6", "train.batch_size=4", "train.warmup_iters=0", "train.eval_interval=3",
           "data.val_fraction=0.25", "train.plot=false", "finetune.guard_prompts=4", "finetune.guard_max_tokens=8",
           "finetune.replay=0"]


def test_a_forgetting_fine_tune_is_stopped_written_rejected_and_never_promoted(knowing_base, tmp_path, monkeypatch,
                                                                               capsys):
    base = knowing_base  # full fine-tuning at a high learning rate on unrelated data: it forgets KNOWN
    data = write_jsonl(tmp_path / "chat.jsonl", _conversations())
    sets = [a for s in [*GUARDED, "finetune.lora=0", "train.learning_rate=0.02",
                        f"finetune.guard_file={_guard_file(tmp_path)}", "finetune.register=tuned",
                        f"run.registry={tmp_path / 'registry'}"] for a in ("--set", s)]
    code, out = _cli(monkeypatch, capsys, "--model", base, "--data", data, "--out", tmp_path / "ft", *sets)
    err = out.err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err and "forgot what base knew" in err, err
    assert "nats/token less likely" in err and "--allow-forgetting" in err
    assert "retention (11 general prompts)" in out.out and "FORGOT" in out.out  # 4 built-in + the user's 7
    ft = json.loads((tmp_path / "ft" / "tinystack.json").read_text())["finetune"]
    kept = ft["retention"]  # the thresholds are the defaults
    assert ft["rejected"] and not kept["passed"] and kept["nll_increase"] > FinetuneConfig().max_retention_nll
    assert kept["facts_base_right"] >= 3 and kept["fact_retention"] < FinetuneConfig().min_fact_retention
    reg = ModelRegistry(tmp_path / "registry")  # added for the record, never current
    assert reg.versions("tuned") == ["v1"] and reg.current("tuned") is None and "not promoted" in out.out
    with pytest.raises(RegistryError, match="v1 is not promotable: the fine-tune forgot"):
        reg.promote("tuned", "v1")
    code, out = _cli(monkeypatch, capsys, "tuned", "v1", "--registry", tmp_path / "registry", command="models promote")
    assert code == 2 and out.err.startswith("error: tuned v1 is not promotable: the fine-tune forgot"), out.err
    assert reg.current("tuned") is None

    code, out = _cli(monkeypatch, capsys, "--model", base, "--data", data, "--out", tmp_path / "ok", *sets,
                     "--allow-forgetting")
    assert code in (0, None), out.err
    ft = json.loads((tmp_path / "ok" / "tinystack.json").read_text())["finetune"]
    assert ft["rejected"] is None and not ft["retention"]["passed"]  # accepted, the scores kept
    assert reg.current("tuned") == "v2"  # and, its held-out loss below the base's, promoted


def test_a_gentle_lora_fine_tune_passes_and_replay_adds_the_bases_answers(knowing_base, tmp_path):
    data = write_jsonl(tmp_path / "chat.jsonl", _conversations())
    # a tiny model's greedy answers are fragile (one of KNOWN flips at any learning rate): the facts' share
    # is not asked here, the likelihood of the base's answers is
    cfg = load_config(None, [*GUARDED, "finetune.lora=4", "train.learning_rate=1e-4", "finetune.replay=6",
                             "finetune.min_fact_retention=0", f"finetune.guard_file={_guard_file(tmp_path)}"],
                      defaults=FINETUNE_DEFAULTS)
    report = finetune(knowing_base, data, tmp_path / "ft", cfg, progress=False)
    assert report["retention"]["passed"] and report["rejected"] is None
    assert report["retention"]["nll_increase"] < 0.1 and report["retention"]["prompts"] == 11
    assert 0 < report["data"]["replayed"] <= 6  # the base's answers that ended within the token budget


def test_bad_input_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    base = model_dir(tmp_path / "base", "llama")
    no_answers = write_jsonl(tmp_path / "q.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 3)
    one_source = write_jsonl(tmp_path / "one.jsonl", _conversations(sources=1))
    for data, message in [(no_answers, "no usable conversation for training (3 rejected"),
                          (one_source, "no held-out conversation left")]:
        code, out = _cli(monkeypatch, capsys, "--model", base, "--data", data, "--out", tmp_path / "out")
        err = out.err.strip()
        assert code == 2 and message in err and "\n" not in err, err
        assert not (tmp_path / "out").exists() and not (tmp_path / "out_finetune").exists()


def test_a_lora_fine_tune_registers_its_adapter_gated_against_the_base_and_the_current_adapter(knowing_base,
                                                                                               tmp_path):
    """--register with LoRA puts the adapter (PEFT's layout, its base named by hash) into the registry: current when
    it beats the base; a later one that does not beat the current adapter on its own held-out split is added,
    never promoted, and `models promote` refuses it naming the adapter it lost to."""
    from tinystack.atomic import file_sha256

    data = write_jsonl(tmp_path / "narrow.jsonl", _conversations(answer="alpha beta gamma"))
    registry = tmp_path / "registry"

    def tune(out, *sets):
        cfg = load_config(None, [*GUARDED, "finetune.lora=4", "finetune.allow_forgetting=true",
                                 "finetune.register=ada", f"run.registry={registry}", *sets],
                          defaults=FINETUNE_DEFAULTS)
        return finetune(knowing_base, data, tmp_path / out, cfg, progress=False)

    first = tune("v1", "train.learning_rate=0.01", "train.max_iters=8")
    reg = ModelRegistry(registry)
    assert first["heldout"]["delta"] < 0 and first["heldout"]["current"] is None
    assert reg.current("ada") == "v1" and (reg.model_dir("ada") / "adapter_config.json").is_file()
    record = reg.record("ada")
    assert record["kind"] == "lora" and record["base_model_sha256"] == file_sha256(knowing_base / "model.safetensors")

    second = tune("v2", "train.learning_rate=1e-5", "train.max_iters=1")  # hardly trained: worse than v1
    current = second["heldout"]["current"]
    assert current["version"] == "v1" and current["delta"] > 0 and second["heldout"]["delta"] < current["delta"]
    assert reg.versions("ada") == ["v1", "v2"] and reg.current("ada") == "v1"
    with pytest.raises(RegistryError, match="not below that of v1, the adapter current when it was registered"):
        reg.promote("ada", "v2")
