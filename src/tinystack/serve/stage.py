"""The serving stage of `tinystack run`: the real server on 127.0.0.1 answering the demo prompts,
with their latency breakdown."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from tinystack.config import Config
from tinystack.progress import console


def stage_demo(cfg: Config, model_dir: Path, log_path: Path) -> list[dict[str, Any]]:
    """Start the real server on 127.0.0.1, send the demo prompts, print answers and timing."""
    import httpx

    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, run_in_background
    from tinystack.serve.engine.adapter import load_engine

    engine = load_engine(model_dir, cfg.infer, cfg.run.device)  # the construction `tinystack serve` uses
    request_log = setup_request_log(log_path)
    answers = []
    try:
        app = create_app(engine, cfg.serve, request_log=request_log, model_dir=model_dir)
        with run_in_background(app, host="127.0.0.1", port=cfg.run.demo_port) as url:
            console.print(f"serve: server up at {url}")
            with httpx.Client(base_url=url, timeout=cfg.serve.timeout_s + 5) as client:
                for i, prompt in enumerate(cfg.run.demo_prompts):
                    body = {"prompt": prompt, "max_tokens": cfg.run.demo_max_tokens, "temperature": 0.8,
                            "top_k": 50, "top_p": 0.95, "seed": i}
                    resp = client.post("/generate", json=body)
                    resp.raise_for_status()
                    answers.append(resp.json())
    finally:
        request_log.close()
        engine.shutdown()  # the AsyncEngine's thread
    table = Table(title="demo requests (POST /generate)")
    for col in ("prompt -> completion", "tokens", "queue ms", "infer ms", "total ms"):
        table.add_column(col)
    for prompt, a in zip(cfg.run.demo_prompts, answers):
        t = a["timing"]
        text = (prompt + "[bold]" + a["text"].replace("[", r"\[") + "[/bold]").replace("\n", " ")
        table.add_row(text, str(a["completion_tokens"]), f"{t['queue_ms']:.1f}", f"{t['inference_ms']:.1f}",
                      f"{t['total_ms']:.1f}")
    console.print(table)
    return answers
