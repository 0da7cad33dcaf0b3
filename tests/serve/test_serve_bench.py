"""The load generator and `tinystack bench serve`: bounded, and its figures add up."""
import asyncio
import json
import sys

import pytest
import typer
from typer.testing import CliRunner

from tinystack.serve.bench import run_load, summary
from tinystack.serve.commands import bench_serve


def test_closed_loop_and_poisson_loads_report_consistent_figures(serve, engine):
    served = serve(engine, max_num_seqs=2, max_queued_requests=64)

    def body(i):
        return {"prompt": f"return the {i}", "max_tokens": 5, "ignore_eos": True}

    for rate in (None, 50.0):
        results, elapsed = asyncio.run(run_load(served.url, body, concurrency=3, num_requests=9, rate=rate))
        s = summary(results, elapsed)
        assert s["requests"] == s["ok"] == 9 and s["errors"] == {}
        assert sum(r.output_tokens for r in results) == 45
        assert abs(s["output_tokens_per_s"] * elapsed - 45) < 0.1  # rounded to 0.01 tokens/s
        assert 0 < s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"] and s["e2e_ms"]["p50"] <= s["e2e_ms"]["p99"]
        assert s["tpot_ms"]["p50"] > 0


def test_bench_serve_command_against_a_model_dir(tmp_path, model_dir):
    app = typer.Typer()
    app.command()(bench_serve)
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["--model", str(model_dir), "--scheduler", "continuous", "--max-num-seqs", "4",
                                 "--concurrency", "1,4", "--requests", "6", "--max-tokens", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["rows"]
    assert [row["concurrency"] for row in rows] == [1, 4] and all(row["ok"] == 6 for row in rows)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_bench_serve_in_process_measures_the_stream_as_it_arrives(tmp_path, model_dir, monkeypatch, loop):
    """`--model` serves in this process: the client's TTFT is well before the end and its TPOT is the
    engine's pace, not a stream that arrived in one piece (TTFT ~ e2e, TPOT ~ 0.02 ms)."""
    if loop == "asyncio":
        monkeypatch.setitem(sys.modules, "uvloop", None)  # uvicorn without uvloop, as a plain install has it
    else:
        pytest.importorskip("uvloop")
    app = typer.Typer()
    app.command()(bench_serve)
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["--model", str(model_dir), "--max-num-seqs", "2", "--concurrency", "1",
                                 "--requests", "6", "--max-tokens", "16", "--prompt", "return the", "--out", str(out)])
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["ok"] == 6
    decode = row["breakdown_p50_ms"]["decode"]  # the server's own decode time (engine stamps)
    assert decode > 0
    assert row["ttft_ms"]["p50"] < row["e2e_ms"]["p50"] - 0.5 * decode, row
    assert row["tpot_ms"]["p50"] >= 0.3 * decode / 15, row  # 16 tokens: 15 gaps at the engine's pace


@pytest.mark.parametrize("frames, status", [
    (['data: {"choices": [{"text": "a"}]}', "data: [DONE]"], 200),
    (['data: {"choices": [{"text": "a"}]}', 'data: {"choi'], 500),  # a frame cut mid-line (connection lost)
    (['data: {"choices": [{"text": "a"}]}'], 500),  # ended without [DONE]
    (['data: {"choices": [{"text": "a"}]}', 'data: {"error": {"message": "replica lost"}}', "data: [DONE]"], 500),
])
def test_a_cut_stream_counts_as_an_error_not_a_success(frames, status):
    """The load generator's client: only a stream that reaches [DONE] without an error event is a 200."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from tinystack.serve.bench import one_request

    async def completions(request):
        async def body():
            for f in frames:
                yield f + "\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await one_request(client, {"prompt": "x"})

    result = asyncio.run(main())
    assert result.status == status and result.ttft_s is not None
