"""The regression gate: passes on the same model, fails on a model made worse on purpose; case semantics."""
import json
import math
import re
import shutil

import pytest
import torch
from typer.testing import CliRunner

from tinystack.eval.case_sets import build_cases, build_chat_cases
from tinystack.eval.commands import app
from tinystack.eval.gate import run_regression
from tinystack.eval.regression import Case, load_cases, run_case, write_cases
from tinystack.eval.scoring import target_nats
from tinystack.infer.chat import ChatFormatter, encode_chat
from tinystack.model.io import load_model, save_model
from tinystack.tokenizer import BPETokenizer


def _cases(toy_doc):
    import random

    rng = random.Random(7)
    records = [{"text": toy_doc(rng, 4), "id": f"d{i}"} for i in range(10)]
    cases = build_cases(records, 6, threshold=math.log(300))
    cases.append(Case(id="greedy-the", prompt="the big cat sees", expect="regex", target=r"\bthe\b"))
    return cases


@pytest.fixture
def perturbed_dir(toy_model_dir, tmp_path):
    model = load_model(toy_model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    out = tmp_path / "perturbed"
    save_model(model, out, eos_token_id=BPETokenizer.load(toy_model_dir).eos_token_id)
    shutil.copy(toy_model_dir / "tokenizer.json", out / "tokenizer.json")
    return out


def test_built_cases_are_valid_and_the_trained_model_passes_them(toy_model_dir, toy_rng_doc, tmp_path):
    cases = _cases(toy_rng_doc[0])
    assert len(cases) == 7
    for c in cases[:-1]:
        assert c.expect == "max_loss" and c.target and c.prompt.endswith(c.prompt.rstrip())
    write_cases(tmp_path / "cases.jsonl", cases)
    assert load_cases(tmp_path / "cases.jsonl") == cases
    result = run_regression(toy_model_dir, cases)
    assert result["summary"]["new_passed"] == len(cases), result["new"]["cases"]


def test_a_uniform_guess_bar_is_stored_per_byte_of_each_target(toy_model_dir, toy_rng_doc):
    import random

    tok = BPETokenizer.load(toy_model_dir)
    records = [{"text": toy_rng_doc[0](random.Random(3), 4), "id": f"d{i}"} for i in range(8)]
    cases = build_cases(records, 5, threshold=math.log(300), tokenizer=tok, max_target_tokens=64)
    assert len(cases) == 5
    for c in cases:  # ln(V) a token = ln(V) x tokens / bytes a byte: what a uniform guess scores on this target
        per_byte = math.log(300) * len(tok.encode_ordinary(c.target)) / len(c.target.encode("utf-8"))
        assert c.threshold == pytest.approx(per_byte, abs=1e-4) and c.threshold < math.log(300)


def test_gate_passes_on_the_same_model_and_fails_on_a_perturbed_one(toy_model_dir, perturbed_dir, toy_rng_doc):
    cases = _cases(toy_rng_doc[0])
    same = run_regression(toy_model_dir, cases, toy_model_dir)
    assert not same["summary"]["regressed"]
    assert all(r["verdict"] == "same" and r["delta"] == 0 for r in same["rows"])
    worse = run_regression(perturbed_dir, cases, toy_model_dir)
    assert worse["summary"]["regressed"] and worse["summary"]["mean_loss_delta"] > 0.05
    assert worse["summary"]["worse"] >= 1
    # the other way round the perturbed model is the baseline: nothing got worse
    better = run_regression(toy_model_dir, cases, perturbed_dir)
    assert not better["summary"]["regressed"] and better["summary"]["better"] >= 1


def test_regress_command_exit_status(toy_model_dir, perturbed_dir, toy_rng_doc, tmp_path):
    write_cases(tmp_path / "cases.jsonl", _cases(toy_rng_doc[0]))
    runner = CliRunner()
    args = ["regress", "--cases", str(tmp_path / "cases.jsonl"), "--baseline", str(toy_model_dir)]
    ok = runner.invoke(app, [*args, "--model", str(toy_model_dir), "--out", str(tmp_path / "r.json")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["regressed"] is False
    bad = runner.invoke(app, [*args, "--model", str(perturbed_dir)])
    assert bad.exit_code == 1, bad.output
    assert "worse" in bad.output and "REGRESSED" in bad.output
    # a huge tolerance forgives score drifts, but never a case that passed before and fails now
    loose = runner.invoke(app, [*args, "--model", str(perturbed_dir), "--regression-tolerance", "100",
                                "--out", str(tmp_path / "loose.json")])
    rows = json.loads((tmp_path / "loose.json").read_text())["rows"]
    flips = [r for r in rows if r["baseline_passed"] and not r["new_passed"]]
    assert all(r["verdict"] == ("worse" if r in flips else "same") for r in rows)
    assert loose.exit_code == (1 if flips else 0)


def test_case_kinds(toy_model_dir):
    model, tok = load_model(toy_model_dir), BPETokenizer.load(toy_model_dir)
    greedy = run_case(model, tok, Case(id="g", prompt="the big cat", expect="contains", target="zzz"))
    text = greedy["detail"]["completion"]
    assert not greedy["passed"] and greedy["score"] == 1.0 and len(text) > 6, text
    assert run_case(model, tok, Case(id="e", prompt="the big cat", expect="exact", target=text[:5]))["passed"]
    assert run_case(model, tok, Case(id="c", prompt="the big cat", expect="contains", target=text[2:6]))["passed"]
    lp = run_case(model, tok, Case(id="l", prompt="the big cat sees", expect="min_logprob", target=" the",
                                   threshold=-1e9))
    # scored per UTF-8 byte of the target, not per token: the scale a retrained tokenizer does not change
    assert lp["detail"]["target_bytes"] == 4 and lp["detail"]["target_tokens"] >= 1
    assert lp["passed"] and lp["detail"]["logprob"] == pytest.approx(-lp["score"] * 4)
    nats = target_nats(model, [tok.eos_token_id, *tok.encode_ordinary("the big cat sees")], tok.encode_ordinary(" the"))
    assert lp["score"] == pytest.approx(float(nats.sum()) / 4)
    strict = run_case(model, tok, Case(id="m", prompt="the big cat sees", expect="max_loss", target=" the",
                                       threshold=lp["score"] - 1e-6))
    assert not strict["passed"]


TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_chat_case_scores_its_target_after_the_prompt_as_the_chat_is_served(toy_model_dir):
    model, tok = load_model(toy_model_dir), BPETokenizer.load(toy_model_dir)
    chat = ChatFormatter(TEMPLATE)
    case = Case(id="c", prompt="the big cat", expect="max_loss", target=" sees the", threshold=1e9, chat=True,
                system="the dog")
    got = run_case(model, tok, case, formatter=chat)
    served = encode_chat(tok, "<system>the dog\n<user>the big cat\n<assistant>")  # what the server would encode
    nats = target_nats(model, served, tok.encode_ordinary(" sees the"))
    assert got["score"] == pytest.approx(float(nats.sum()) / len(" sees the"))
    plain = run_case(model, tok, Case(id="p", prompt="the big cat", expect="max_loss", target=" sees the",
                                      threshold=1e9))
    assert plain["score"] != pytest.approx(got["score"])  # the template really went in
    later = Case(id="h", prompt="the big cat", expect="max_loss", target=" sees the", threshold=1e9, chat=True,
                 system="the dog",
                 history=[{"role": "user", "content": "a cat"}, {"role": "assistant", "content": "sees"}])
    served = encode_chat(tok, "<system>the dog\n<user>a cat\n<assistant>sees\n<user>the big cat\n<assistant>")
    nats = target_nats(model, served, tok.encode_ordinary(" sees the"))  # a later turn: after the turns before it
    assert run_case(model, tok, later, formatter=chat)["score"] == pytest.approx(float(nats.sum()) / len(" sees the"))
    gen = run_case(model, tok, Case(id="g", prompt="the big cat", expect="regex", target=".", chat=True),
                   formatter=chat)
    assert gen["detail"]["completion"]
    with pytest.raises(ValueError, match="chat case"):
        run_case(model, tok, case)  # no formatter: refused, not scored as plain text


def test_chat_cases_from_conversations_and_their_file_round_trip(toy_model_dir, tmp_path):
    tok = BPETokenizer.load(toy_model_dir)
    conversations = [("a", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "the big cat sees the dog"},
                            {"role": "user", "content": "more"}, {"role": "assistant", "content": "no"}]),
                     ("b", [{"role": "user", "content": "only a question"}]),  # no answer: no case
                     ("c", [{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"},
                            {"role": "assistant", "content": "the dog"}]),
                     ("d", [{"role": "user", "content": "q3"},  # a weight-0 turn is context: the next one is the case
                            {"role": "assistant", "content": "wrong", "weight": 0}, {"role": "user", "content": "q4"},
                            {"role": "assistant", "content": "the cat"}])]
    cases = build_chat_cases(conversations, 10, math.log(300), tok, max_target_tokens=3)
    assert [(c.id, c.system, c.prompt) for c in cases] == [("heldout-a", "be brief", "hi"), ("heldout-c", None, "q2"),
                                                           ("heldout-d", None, "q4")]
    # what came before the answer, as served: the earlier turns (no weights) ride along as the history
    d_history = [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "wrong"}]
    assert [c.history for c in cases] == [None, [{"role": "user", "content": "q1"}], d_history]
    assert cases[2].target.startswith("the c") and "the cat".startswith(cases[2].target)
    twice = build_chat_cases([conversations[0], conversations[0]], 10, math.log(300), tok, max_target_tokens=3)
    assert len({c.id for c in twice}) == 2  # one id, two conversations: the file still loads
    assert all(c.chat and c.expect == "max_loss" for c in cases)
    assert len(tok.encode_ordinary(cases[0].target)) == 3 and "the big cat sees the dog".startswith(cases[0].target)
    plain = Case(id="p", prompt="x", expect="contains", target="y")
    write_cases(tmp_path / "c.jsonl", [*cases, plain])
    assert load_cases(tmp_path / "c.jsonl") == [*cases, plain]
    assert '"chat"' not in (tmp_path / "c.jsonl").read_text().splitlines()[-1]  # plain cases stay as they were


@pytest.mark.parametrize("bad, error", [(dict(expect="nope"), ValueError), (dict(expect="max_loss"), ValueError),
                                        (dict(system="s"), ValueError),  # a system message needs chat: true
                                        (dict(history=[{"role": "user", "content": "a"}]), ValueError),  # also chat
                                        (dict(chat=True, history=[{"role": "system", "content": "a"}]), ValueError),
                                        (dict(chat=True, history=[{"role": "user"}]), ValueError),
                                        (dict(expect="regex", target="("), re.error)])  # re.compile's own error
def test_invalid_cases_are_rejected(bad, error):
    kw = {"id": "x", "prompt": "p", "expect": "contains", "target": "t", **bad}
    with pytest.raises(error):
        Case(**kw)


def test_split_metrics_gate_with_data(toy_model_dir, perturbed_dir, planted_data_dir, toy_rng_doc):
    cases = _cases(toy_rng_doc[0])[:2]
    same = run_regression(toy_model_dir, cases, toy_model_dir, data_dir=planted_data_dir)
    metric_rows = [r for r in same["rows"] if r["expect"] == "metric"]
    assert [r["id"] for r in metric_rows] == ["val bits_per_byte", "test bits_per_byte"]
    assert all(r["delta"] == 0 and r["verdict"] == "same" for r in metric_rows)
    assert not same["summary"]["regressed"]
    worse = run_regression(perturbed_dir, cases, toy_model_dir, data_dir=planted_data_dir, tolerance=1e9)
    assert worse["summary"]["metrics_worse"] == 2 and worse["summary"]["regressed"]


def test_bad_case_file_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "a", "expect": "contains", "target": "b"}\n'
                    '{"prompt": "a", "expect": "max_loss", "target": "b"}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:2: bad case: .*needs a threshold"):
        load_cases(path)
    path.write_text('{"prompt": "a", "expect": "contains", "target": "b", "colour": 1}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:1: bad case"):
        load_cases(path)
