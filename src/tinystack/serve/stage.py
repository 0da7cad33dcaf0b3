"""The serving stage of `tinystack run`: the real server on 127.0.0.1 answering the demo prompts,
with their latency breakdown."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from tinystack.config import Config
from tinystack.progress import console


def _client_timeout_s(server_timeout_s: float) -> float:
    """The demo client waits a little longer than the server may take (its own limit, or the measured one's cap)."""
    from tinystack.serve.engine.deadline import FIRST_S

    return (server_timeout_s or FIRST_S) + 5


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
            with httpx.Client(base_url=url, timeout=_client_timeout_s(cfg.serve.timeout_s)) as client:
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


def stage_chat_demo(cfg: Config, model_dir: Path, log_path: Path) -> list[dict[str, Any]]:
    """Serve a pretrained chat model (`[run] pretrained`, imported by the model stage) on 127.0.0.1, ask it
    `[run] chat_questions` through /v1/chat/completions (greedy) and print its answers with the latency
    breakdown from the response's timing headers (seconds)."""
    from dataclasses import replace

    import httpx

    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, run_in_background
    from tinystack.serve.engine.adapter import load_engine

    name = cfg.run.pretrained.replace("/", "_")
    engine = load_engine(model_dir, cfg.infer, cfg.run.device)
    scfg = replace(cfg.serve, model_name=name)
    request_log = setup_request_log(log_path)
    answers = []
    try:
        with run_in_background(create_app(engine, scfg, request_log=request_log, model_dir=model_dir)) as url:
            console.print(f"serve: {name} up at {url}")
            with httpx.Client(base_url=url, timeout=_client_timeout_s(scfg.timeout_s)) as client:
                for question in cfg.run.chat_questions:
                    resp = client.post("/v1/chat/completions", json={
                        "model": name, "messages": [{"role": "user", "content": question}],
                        "max_tokens": cfg.run.chat_max_tokens, "temperature": 0})
                    resp.raise_for_status()
                    body, h = resp.json(), resp.headers
                    answers.append({"question": question, "answer": body["choices"][0]["message"]["content"],
                                    "finish_reason": body["choices"][0]["finish_reason"],
                                    "tokens": body["usage"]["completion_tokens"],
                                    **{k: float(h[f"x-{k.replace('_', '-')}"]) * 1e3
                                       for k in ("queue_time", "time_to_first_token", "total_time")}})
    finally:
        request_log.close()
        engine.shutdown()
    if not any(a["tokens"] and a["answer"].strip() for a in answers):  # a demo that shows nothing has failed
        raise RuntimeError(f"chat demo: {name} answered none of run.chat_questions ({len(answers)} asked)")
    table = Table(title=f"{name}: chat requests (POST /v1/chat/completions, greedy)")
    for col in ("question -> answer", "tokens", "queue ms", "TTFT ms", "total ms"):
        table.add_column(col)
    for a in answers:
        text = (a["question"] + " -> [bold]" + a["answer"].strip().replace("[", r"\[") + "[/bold]").replace("\n", " ")
        table.add_row(text, str(a["tokens"]), f"{a['queue_time']:.1f}", f"{a['time_to_first_token']:.1f}",
                      f"{a['total_time']:.1f}")
    console.print(table)
    return answers
