"""Cost math, per-key totals from a request log, and `tinystack cost --log FILE`."""
import json

import pytest
import typer
from typer.testing import CliRunner

from tinystack.observe.commands import cost
from tinystack.observe.cost import cost_per_1k_tokens, cost_usd, read_log, summarize_log


def test_cost_is_device_seconds_times_price_per_hour():
    assert cost_usd(3600.0, 0.085) == pytest.approx(0.085)
    assert cost_usd(1.0, 3.6) == pytest.approx(0.001)
    assert cost_per_1k_tokens(0.002, 500) == pytest.approx(0.004)
    assert cost_per_1k_tokens(0.002, 0) is None


def write_log(path, rows):
    lines = [json.dumps(r) for r in rows] + ['{"torn": ']  # a torn last line is skipped
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


ROWS = [
    {"event": "request", "key_id": "aaaaaaaaaaaa", "status": 200, "failure": None, "prompt_tokens_computed": 10,
     "completion_tokens": 5, "device_s": 2.0, "cpu_s": 1.5, "cost_usd": 2.0 * 3.6 / 3600},
    {"event": "request", "key_id": "aaaaaaaaaaaa", "status": 504, "failure": "timeout", "prompt_tokens_computed": 10,
     "completion_tokens": 7, "device_s": 1.0, "cpu_s": 0.5, "cost_usd": 1.0 * 3.6 / 3600},
    {"event": "request", "key_id": "bbbbbbbbbbbb", "status": 200, "failure": None, "prompt_tokens_computed": 3,
     "completion_tokens": 1, "device_s": 0.5, "cpu_s": 0.25, "cost_usd": 0.5 * 3.6 / 3600},
    {"event": "request", "key_id": "anonymous", "status": 200, "path": "/health"},  # no cost: not a generation
]


def test_summarize_log_totals_per_key(tmp_path):
    path = tmp_path / "requests.jsonl"
    write_log(path, ROWS)
    totals = summarize_log(read_log(path))
    assert [t.key_id for t in totals] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]  # by cost, highest first
    a = totals[0]
    assert (a.requests, a.failed, a.prompt_tokens, a.completion_tokens) == (2, 1, 20, 12)
    assert a.device_s == 3.0 and a.cpu_s == 2.0 and a.cost_usd == pytest.approx(0.003)
    assert a.cost_per_1k_tokens == pytest.approx(0.003 / 32 * 1000)


def test_cost_command_prints_a_table_and_json(tmp_path):
    path = tmp_path / "requests.jsonl"
    write_log(path, ROWS)
    app = typer.Typer()
    app.command()(cost)
    runner = CliRunner()
    out = runner.invoke(app, ["--log", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "aaaaaaaaaaaa" in out.output and "bbbbbbbbbbbb" in out.output and "0.003000" in out.output
    out = runner.invoke(app, ["--log", str(path), "--json", "--key", "bbbbbbbbbbbb"])
    rows = json.loads(out.output)
    assert len(rows) == 1 and rows[0]["requests"] == 1 and rows[0]["tokens"] == 4
    assert runner.invoke(app, ["--log", str(tmp_path / "missing.jsonl")]).exit_code != 0
