"""`tinystack bench serve` diagnoses: the latency breakdown (queue / prefill / decode p50), which dominates,
and a PNG of latency percentiles against concurrency."""
import json

import typer
from typer.testing import CliRunner

from tinystack.serve.bench import Result, breakdown_line, summary
from tinystack.serve.commands import bench_serve


def test_breakdown_names_the_dominant_segment():
    def res(q, p, d):
        return Result(200, 0.01, 0.1, 4, {"queue_ms": q, "prefill_ms": p, "decode_ms": d})
    row = summary([res(400.0, 20.0, 80.0), res(300.0, 30.0, 70.0), res(500.0, 10.0, 90.0)], 1.0)
    assert row["breakdown_p50_ms"] == {"queue": 400.0, "prefill": 20.0, "decode": 80.0}
    assert row["dominant"] == "queue" and row["dominant_share"] == 0.8
    assert breakdown_line(row).endswith("queue dominates (80%)")
    assert summary([Result(200, 0.01, 0.1, 4)], 1.0)["dominant"] is None  # no server timing: says so


def test_bench_serve_prints_the_breakdown_and_plots_percentiles(tmp_path, model_dir):
    app = typer.Typer()
    app.command()(bench_serve)
    out, png = tmp_path / "bench.json", tmp_path / "latency.png"
    r = CliRunner().invoke(app, ["--model", str(model_dir), "--max-num-seqs", "2", "--concurrency", "1,4",
                                 "--requests", "6", "--max-tokens", "4", "--out", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        assert row["dominant"] in ("queue", "prefill", "decode")
        assert all(v is not None and v >= 0 for v in row["breakdown_p50_ms"].values())
        assert f"concurrency {row['concurrency']}: " in r.output and "dominates" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
