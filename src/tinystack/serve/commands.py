"""`tinystack serve` (the HTTP server with uvicorn) and `tinystack bench serve` (wired into the CLI by tinystack.cli).

Every ServeConfig field is a flag here and a key in the TOML `[serve]` table; a flag
given on the command line wins over the file and `--set`.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinystack.cli_options import ConfigOpt, SetOpt, resolve_config

Opt = typer.Option


def serve(model: Annotated[Path, Opt(help="Model directory.")], config: ConfigOpt = None, set_: SetOpt = None,
          host: Annotated[Optional[str], Opt(help="serve.host")] = None,
          port: Annotated[Optional[int], Opt(help="serve.port")] = None,
          model_name: Annotated[Optional[str], Opt(help="serve.model_name: id in /v1/models")] = None,
          batching: Annotated[Optional[str], Opt(help="serve.batching: continuous | dynamic | none")] = None,
          max_num_seqs: Annotated[Optional[int], Opt(help="serve.max_num_seqs: sequences generated at once")] = None,
          max_queued_requests: Annotated[Optional[int], Opt(help="serve.max_queued_requests: waiting beyond max_num_seqs, then 429")] = None,
          timeout: Annotated[Optional[float], Opt(help="serve.timeout_s: per request")] = None,
          stall_timeout: Annotated[Optional[float], Opt(help="serve.stall_timeout_s")] = None,
          max_prompt_chars: Annotated[Optional[int], Opt(help="serve.max_prompt_chars")] = None,
          max_tokens_limit: Annotated[Optional[int], Opt(help="serve.max_tokens_limit")] = None,
          default_max_tokens: Annotated[Optional[int], Opt(help="serve.default_max_tokens")] = None,
          max_n: Annotated[Optional[int], Opt(help="serve.max_n: choices per request")] = None,
          max_body_bytes: Annotated[Optional[int], Opt(help="serve.max_body_bytes (413 above)")] = None,
          fallback_text: Annotated[Optional[str], Opt(help="serve.fallback_text: degraded answer; empty = 503")] = None,
          breaker_failures: Annotated[Optional[int], Opt(help="serve.breaker_failures: failures that open the breaker")] = None,
          breaker_cooldown: Annotated[Optional[float], Opt(help="serve.breaker_cooldown_s")] = None,
          watchdog_interval: Annotated[Optional[float], Opt(help="serve.watchdog_interval_s")] = None,
          api_key_env: Annotated[Optional[str], Opt(help="serve.api_key_env: env var with comma-separated keys")] = None,
          api_key_file: Annotated[Optional[str], Opt(help="serve.api_key_file: file of SHA-256 key hashes")] = None,
          open_health: Annotated[Optional[bool], Opt("--open-health/--closed-health",
                                                     help="serve.open_health: /health, /ready, /metrics without a key")] = None,
          rate_limit: Annotated[Optional[float], Opt(help="serve.rate_limit_rpm: requests/min per key")] = None,
          rate_limit_tokens: Annotated[Optional[float], Opt(help="serve.rate_limit_tpm: tokens/min per key")] = None,
          shutdown_grace: Annotated[Optional[float], Opt(help="serve.shutdown_grace_s")] = None,
          drain_delay: Annotated[Optional[float], Opt(help="serve.drain_delay_s")] = None,
          price_per_device_hour: Annotated[Optional[float], Opt(help="serve.price_per_device_hour: USD, for the "
                                                                     "cost of each request")] = None,
          otel_exporter: Annotated[Optional[str], Opt(help="serve.otel_exporter: '' | console | otlp")] = None,
          gc_freeze: Annotated[Optional[bool], Opt("--gc-freeze/--no-gc-freeze", help="serve.gc_freeze")] = None,
          loop_lag_interval: Annotated[Optional[float], Opt(help="serve.loop_lag_interval_s (0 = off)")] = None,
          log_text: Annotated[Optional[bool], Opt("--log-text/--no-log-text",
                                                  help="serve.log_text: prompts and outputs in the log")] = None,
          log: Annotated[Optional[Path], Opt(help="Request log (JSONL); default stderr.")] = None,
          log_level: Annotated[str, Opt(help="uvicorn log level")] = "info") -> None:
    """Serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models), /generate,
    /health, /ready and Prometheus /metrics with uvicorn (gc.freeze() once the model is loaded)."""
    from tinystack.observe import setup_request_log
    from tinystack.serve import create_app, serve_forever
    from tinystack.serve.engine.adapter import load_engine

    cfg = resolve_config(config, set_)
    flags = dict(host=host, port=port, model_name=model_name, batching=batching, max_num_seqs=max_num_seqs,
                 max_queued_requests=max_queued_requests, timeout_s=timeout, stall_timeout_s=stall_timeout,
                 max_prompt_chars=max_prompt_chars, max_tokens_limit=max_tokens_limit,
                 default_max_tokens=default_max_tokens, max_n=max_n, max_body_bytes=max_body_bytes,
                 fallback_text=fallback_text, breaker_failures=breaker_failures, breaker_cooldown_s=breaker_cooldown,
                 watchdog_interval_s=watchdog_interval, api_key_env=api_key_env, api_key_file=api_key_file,
                 open_health=open_health, rate_limit_rpm=rate_limit, rate_limit_tpm=rate_limit_tokens,
                 shutdown_grace_s=shutdown_grace, drain_delay_s=drain_delay,
                 price_per_device_hour=price_per_device_hour, otel_exporter=otel_exporter, gc_freeze=gc_freeze,
                 loop_lag_interval_s=loop_lag_interval, log_text=log_text)
    scfg = replace(cfg.serve, **{k: v for k, v in flags.items() if v is not None})
    try:
        engine = load_engine(model, scfg.batching, scfg.max_num_seqs, cfg.run.device)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    request_log = setup_request_log(log, stream=None if log else sys.stderr, include_text=scfg.log_text)
    typer.echo(f"tinystack serve: {model} on http://{scfg.host}:{scfg.port}", err=True)
    for key, value in sorted(vars(scfg).items()):
        typer.echo(f"  {key} = {value!r}", err=True)
    try:
        app = create_app(engine, scfg, request_log=request_log, model_dir=model)
    except (ValueError, ImportError) as e:  # e.g. an unknown otel_exporter, or the [otel] extra missing
        request_log.close()
        if hasattr(engine, "shutdown"):
            engine.shutdown()
        raise typer.BadParameter(str(e)) from None
    try:
        serve_forever(app, scfg.host, scfg.port, log_level, shutdown_grace_s=scfg.shutdown_grace_s,
                      drain_delay_s=scfg.drain_delay_s)
    finally:
        request_log.close()
        if hasattr(engine, "shutdown"):
            engine.shutdown()


def hash_key(key: Annotated[str, typer.Argument(help="An API key to allow.")]) -> None:
    """Print the SHA-256 line for `key`, to append to the file given as --api-key-file."""
    from tinystack.serve.guards.auth import hash_key as _hash

    typer.echo(_hash(key))


def bench_serve(url: Annotated[Optional[str], Opt(help="A running server's base URL.")] = None,
                model: Annotated[Optional[Path], Opt(help="Or: serve this model directory here (127.0.0.1).")] = None,
                batching: Annotated[str, Opt(help="With --model: continuous | dynamic | none")] = "continuous",
                max_num_seqs: int = 64,
                concurrency: Annotated[str, Opt(help="Comma-separated client counts.")] = "1,4,16,64",
                requests: Annotated[int, Opt(help="Requests per level (0: 2 x concurrency, at least 8).")] = 0,
                rate: Annotated[Optional[float], Opt(help="Poisson arrivals at this many requests/s "
                                                          "(concurrency then caps requests in flight).")] = None,
                prompt: str = "Return the number of items in the list",
                max_tokens: int = 16, max_seconds: float = 120.0,
                api_key: Annotated[Optional[str], Opt(envvar="TINYSTACK_API_KEY")] = None,
                out: Annotated[Optional[Path], Opt(help="Write the figures as JSON here.")] = None,
                plot: Annotated[Optional[Path], Opt(help="Write a PNG of latency p50/p90/p99 vs concurrency.")] = None
                ) -> None:
    """Load-test the OpenAI endpoint (closed loop or Poisson): requests/s, tokens/s, TTFT, TPOT, e2e p50/p90/p99,
    and the latency breakdown (queue vs prefill vs decode, p50) with the segment that dominates."""
    import asyncio
    import json
    from contextlib import ExitStack

    from tinystack.atomic import write_json
    from tinystack.config import ServeConfig
    from tinystack.serve import create_app, run_in_background
    from tinystack.serve.bench import breakdown_line, plot_percentiles, run_load, summary
    from tinystack.serve.engine.adapter import load_engine

    if (url is None) == (model is None):
        raise typer.BadParameter("give exactly one of --url and --model")
    rows = []
    with ExitStack() as stack:
        if model is not None:
            engine = load_engine(model, batching, max_num_seqs)
            if hasattr(engine, "shutdown"):
                stack.callback(engine.shutdown)
            cfg = replace(ServeConfig(), max_num_seqs=max_num_seqs, max_queued_requests=4096, timeout_s=600,
                          stall_timeout_s=600)
            url = stack.enter_context(run_in_background(create_app(engine, cfg, model_dir=model)))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        for c in (int(x) for x in concurrency.split(",")):
            n = requests or max(8, 2 * c)
            results, elapsed = asyncio.run(run_load(
                url, lambda i: {"prompt": f"{prompt} {i}", "max_tokens": max_tokens, "ignore_eos": True, "seed": i},
                concurrency=c, num_requests=n, rate=rate, max_seconds=max_seconds, headers=headers))
            rows.append({"concurrency": c, "rate": rate, **summary(results, elapsed)})
            typer.echo(json.dumps(rows[-1]))
            typer.echo(f"concurrency {c}: {breakdown_line(rows[-1])}")
    if out:
        write_json(out, {"url": url if model is None else None, "model": str(model) if model else None,
                         "batching": batching if model else None, "rows": rows})
    if plot:
        plot_percentiles(rows, plot, title=f"tinystack bench serve ({batching if model else url})")
