"""`tinystack eval --model --data` writes eval.json.

The report renders it to report.md + a self-contained report.html.
"""
import json
import re

from typer.testing import CliRunner

from tinystack.atomic import write_json
from tinystack.errors import UserError
from tinystack.eval.commands import app
from tinystack.eval.gate import build_heldout_cases, run_regression
from tinystack.eval.report import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_eval_command_then_report(toy_model_dir, planted_data_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    res = CliRunner().invoke(app, ["--model", str(toy_model_dir), "--data", str(planted_data_dir),
                                   "--out", str(work / "eval.json"), "--set", "eval.gen_max_tokens=8"])
    assert res.exit_code == 0, res.output
    ev = json.loads((work / "eval.json").read_text())
    assert {"val", "test", "findings", "generation"} <= ev.keys()
    assert ev["val"]["loss"] > 0 and 0 <= ev["val"]["accuracy"] <= 1 and "by_source" in ev["val"]["docs"]
    assert "Worst source (val): `noise`" in res.output

    cases = build_heldout_cases(toy_model_dir, planted_data_dir, 4)
    assert len(cases) == 4
    write_json(work / "regression.json", run_regression(toy_model_dir, cases, toy_model_dir))
    (work / "train_log.jsonl").write_text("".join(
        json.dumps({"step": i, "loss": 5 - i / 50, **({"val_loss": 5 - i / 60} if i % 10 == 9 else {})}) + "\n"
        for i in range(100)))

    out = write_report(work)
    assert sorted(out["plots"]) == ["loss_vs_length.png", "training_loss.png", "val_loss_per_source.png"]
    md = (work / "report.md").read_text()
    for name in out["plots"]:
        assert f"(report_files/{name})" in md
        assert (work / "report_files" / name).read_bytes().startswith(PNG_MAGIC)
    assert "## Regression set" in md and "| heldout-" in md and "## Bad cases (val)" in md
    assert "| noise |" in md  # the bad-case table names the planted source

    page = (work / "report.html").read_text()
    srcs = re.findall(r"src='([^']*)'", page)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)  # self-contained
    assert "href=" not in page and "<link" not in page
    assert "Worst source (val): `noise`" in page and "no regression." in page


def test_eval_command_needs_data_or_tokens(toy_model_dir):
    res = CliRunner().invoke(app, ["--model", str(toy_model_dir)])
    assert isinstance(res.exception, UserError) and "--data" in str(res.exception)  # one line, exit 2, in the CLI


def test_group_mounted_like_the_cli_does_runs_both_forms(toy_model_dir, planted_data_dir, tmp_path):
    """`app.add_typer(eval_app, name="eval")`: `eval --model --tokens/--data` and `eval regress` both work."""
    import typer

    root = typer.Typer()
    root.command("noop")(lambda: None)  # a second command, so "eval" stays a named subcommand
    root.add_typer(app, name="eval")
    runner = CliRunner()
    res = runner.invoke(root, ["eval", "--model", str(toy_model_dir), "--data", str(planted_data_dir),
                               "--out", str(tmp_path / "e.json"), "--set", "eval.max_docs=5"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "e.json").read_text())["val"]["docs"]["total"]["docs"] == 5
    from tinystack.eval.regression import Case, write_cases

    write_cases(tmp_path / "c.jsonl",
                [Case(id="a", prompt="the big", expect="max_loss", target=" cat", threshold=99.0)])
    res = runner.invoke(root, ["eval", "regress", "--model", str(toy_model_dir), "--baseline", str(toy_model_dir),
                               "--cases", str(tmp_path / "c.jsonl")])
    assert res.exit_code == 0 and "0 worse" in res.output, res.output
