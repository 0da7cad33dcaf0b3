"""The served engine comes from [infer]: weight_format, KV cache kind, scheduler and max_num_seqs
reach the engine, and the server's admission gate follows the engine's max_num_seqs (it has no copy of its own)."""
import json

import httpx
import pytest
import torch
import typer
from typer.testing import CliRunner

from tinystack.config import InferConfig, ServeConfig
from tinystack.infer.batcher import DynamicBatcher
from tinystack.infer.quant.linear import QuantLinear
from tinystack.serve import create_app, run_in_background
from tinystack.serve.commands import bench_serve
from tinystack.serve.engine.adapter import load_engine


@pytest.mark.parametrize("infer", [
    InferConfig(weight_format="bfloat16", kv_cache="contiguous", scheduler="dynamic", max_num_seqs=2,
                memory_limit_mb=256),
    InferConfig(weight_format="q8_0", kv_cache="paged", kv_block_size=8, max_num_seqs=3, enable_prefix_caching=False,
                memory_limit_mb=256),
], ids=["bf16-contiguous-dynamic", "q8_0-paged"])
def test_load_engine_builds_what_the_infer_section_says_and_serves_it(model_dir, infer):
    engine = load_engine(model_dir, infer)
    try:
        llm = engine.engine
        assert llm.config is infer
        assert llm.scheduler.max_num_seqs == infer.max_num_seqs
        assert isinstance(llm.scheduler, DynamicBatcher) == (infer.scheduler == "dynamic")
        assert llm.budget.block_size == (llm.max_seq_len if infer.kv_cache == "contiguous" else infer.kv_block_size)
        assert llm.budget.memory_limit == infer.memory_limit_mb * 2**20
        q8 = any(isinstance(m, QuantLinear) and m.fmt == "q8_0" for m in llm.model.modules())
        assert q8 == (infer.weight_format == "q8_0")
        assert llm.dtype == (torch.bfloat16 if infer.weight_format == "bfloat16" else torch.float32)
        app = create_app(engine, ServeConfig(max_queued_requests=1), model_dir=model_dir)
        with run_in_background(app) as url:
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "return the", "max_tokens": 3}, timeout=30)
            assert r.status_code == 200, r.text
            health = httpx.get(f"{url}/health", timeout=5).json()
            assert health["max_num_seqs"] == infer.max_num_seqs
            assert app.state.server.gate.capacity == infer.max_num_seqs + 1  # the engine's cap + the queue
    finally:
        engine.shutdown()


def test_bench_serve_builds_its_engine_from_infer_flags(tmp_path, model_dir):
    app = typer.Typer()
    app.command()(bench_serve)
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["--model", str(model_dir), "--kv-cache", "contiguous", "--scheduler", "dynamic",
                                 "--max-num-seqs", "2", "--max-wait-s", "0.01", "--concurrency", "2",
                                 "--requests", "4", "--max-tokens", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    written = json.loads(out.read_text())
    assert written["infer"]["kv_cache"] == "contiguous" and written["infer"]["scheduler"] == "dynamic"
    assert written["infer"]["max_num_seqs"] == 2 and written["rows"][0]["ok"] == 4


def test_load_engine_returns_once_the_kv_caches_first_pages_are_in(model_dir, monkeypatch):
    import threading
    import time

    from tinystack.infer import paged_cache

    slow_done = threading.Event()

    def slow_prefault(*stores):  # the OS taking its time, as on a VM whose memory is backed on first touch
        time.sleep(0.5)
        slow_done.set()

    monkeypatch.setattr(paged_cache, "_prefault_first_pages", slow_prefault)
    engine = load_engine(model_dir, InferConfig(memory_limit_mb=64))
    try:
        assert slow_done.is_set() and not engine.engine.storage.prefault.is_alive()
    finally:
        engine.shutdown()

