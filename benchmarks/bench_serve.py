"""Serving benchmark: the HTTP server under load, for continuous batching vs the dynamic batcher vs no batching.

A GPT-2-124M-shaped random model (12 x 768, 12 heads, vocab 50257, float32) is served
by the real server (uvicorn on 127.0.0.1) over an AsyncEngine with each scheduler:

    continuous  continuous batching, up to 64 sequences, paged KV cache
    dynamic     the dynamic batcher (batches of up to 64, collected for up to 50 ms)
    none        one sequence at a time

and driven by our load generator (tinystack.serve.bench, closed loop) at concurrency
1, 4, 16, 64: requests/s, output tokens/s, TTFT, TPOT and e2e latency (p50/p90/p99),
and the server's latency breakdown (p50 of queue, prefill and decode time, from each
stream's final `timing` chunk) with the segment that dominates.
Prompts are 16 random token ids, 16 new tokens each (ignore_eos). Text is not what
is measured: a stand-in tokenizer writes token ids as text.

HTTP overhead: p50 latency of a 1-token request through the server (its own process,
non-streaming, keep-alive) minus p50 of the same request straight through an identical
AsyncEngine in this process, measured as interleaved pairs in one run (target <= 5 ms).
It uses a 1-layer 64-wide model with GPT-2's vocabulary: the HTTP layer's cost does not
depend on the model, and on a shared CPU a 124M model's own jitter (hundreds of ms under
load) would bury a few milliseconds.

Wall-clock times (a server is about latency as users see it); the machine is shared,
so the load average is recorded. Writes benchmarks/results/serve.json, serve.png
(throughput, p50) and serve_latency.png (e2e and TTFT p50/p90/p99 against concurrency).

The default run is bounded (a few minutes on 2 shared cores): a 4-layer model of the
124M shape, concurrency 1, 4, 16. `--full` is the 12-layer 124M run at 1, 4, 16, 64.

    .venv/bin/python benchmarks/bench_serve.py [--full] [--concurrency 1,4,16] [--modes continuous,dynamic,none]
                                               [--n-layer 4] [--new 16] [--prompt 16] [--pairs 30]
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine  # noqa: E402
from bench_infer_common import IdTokenizer, gpt2_124m, random_prompt  # noqa: E402
from tinystack.atomic import atomic_open, write_json  # noqa: E402
from tinystack.config import (
    InferConfig,
    ServeConfig,  # noqa: E402
)
from tinystack.infer import AsyncEngine, LLMEngine, SamplingParams  # noqa: E402
from tinystack.serve import create_app, run_in_background  # noqa: E402
from tinystack.serve.bench import breakdown_line, plot_percentiles, run_load, summary  # noqa: E402


class NumberTokenizer(IdTokenizer):
    """Text is token ids written as numbers: "17 42 99" <-> [17, 42, 99] (any id of the 50257)."""

    def encode_ordinary(self, text: str) -> list[int]:
        return [int(t) % 50257 for t in text.split() if t.isdigit()]

    def decode(self, ids) -> str:
        return "".join(f" {i}" for i in ids)


def make_engine(model, mode: str) -> AsyncEngine:
    kw = {"continuous": dict(scheduler="continuous", max_num_seqs=64),
          "dynamic": dict(scheduler="dynamic", max_num_seqs=64, max_wait_s=0.05),
          "none": dict(scheduler="continuous", max_num_seqs=1)}[mode]
    return AsyncEngine(LLMEngine(model, NumberTokenizer(), InferConfig(max_num_batched_tokens=2048, **kw)))


CFG = replace(ServeConfig(), max_queued_requests=512, timeout_s=600, stall_timeout_s=600,
              max_tokens_limit=1024)


def load_test(model, mode: str, concurrencies: list[int], prompt: int, new: int) -> list[dict]:
    engine = make_engine(model, mode)
    rows = []
    try:
        with run_in_background(create_app(engine, CFG), shutdown_timeout_s=30) as url:
            def body(i: int) -> dict:
                return {"prompt": " ".join(map(str, random_prompt(prompt, seed=i))), "max_tokens": new,
                        "temperature": 0, "ignore_eos": True}

            asyncio.run(run_load(url, body, concurrency=1, num_requests=1))  # warm-up
            for c in concurrencies:
                n = max(8, 2 * c) if c < 16 else c
                results, elapsed = asyncio.run(run_load(url, body, concurrency=c, num_requests=n, max_seconds=240))
                row = {"mode": mode, "concurrency": c, "n_layer": model.config.n_layer, **summary(results, elapsed)}
                rows.append(row)
                print(f"{mode:>10} c={c:<3} {row['requests_per_s']:7.2f} req/s {row['output_tokens_per_s']:8.1f} tok/s"
                      f"  TTFT p50 {row['ttft_ms']['p50']} ms  TPOT p50 {row['tpot_ms']['p50']} ms"
                      f"  e2e p50/p90/p99 {row['e2e_ms']['p50']}/{row['e2e_ms']['p90']}/{row['e2e_ms']['p99']} ms"
                      f"  errors {row['errors']}", flush=True)
                print(f"{'':>10} {'':<5} breakdown: {breakdown_line(row)}", flush=True)
    finally:
        engine.shutdown()
    return rows


def small_model():
    """For the HTTP overhead: a 1-layer, 64-wide GPT with GPT-2's vocabulary (seeded), so the engine's
    time per request is a few ms and steady, and the difference measured is the HTTP layer's."""
    from tinystack.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=1, n_head=2, n_embd=64)).eval()


def serve_only(port: int) -> None:
    """Child process of http_overhead: the same small model (same seed) served on 127.0.0.1:port until killed."""
    from tinystack.serve import serve_forever

    model = small_model()
    serve_forever(create_app(make_engine(model, "continuous"), CFG), "127.0.0.1", port, log_level="warning")


def http_overhead(pairs: int, prompt: int) -> dict:
    """Interleaved pairs of the same 1-token request: through the server (its own process, as a real
    client sees it: no shared GIL with the client) and straight through an identical AsyncEngine here."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    child = subprocess.Popen([sys.executable, __file__, "--serve-only", str(port),
                              "--threads", str(torch.get_num_threads())],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = make_engine(small_model(), "continuous")
    loop = asyncio.new_event_loop()
    ids = random_prompt(prompt, seed=123)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    server_s, engine_s = [], []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # keep-alive, the lightest stdlib client
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                conn.request("GET", "/ready")
                ready = conn.getresponse()
                ready.read()
                if ready.status == 200:
                    break
            except OSError:
                conn.close()
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.2)
        body = json.dumps({"prompt": " ".join(map(str, ids)), "max_tokens": 1, "temperature": 0,
                           "ignore_eos": True}).encode()
        headers = {"Content-Type": "application/json"}
        for i in range(pairs + 3):  # the first 3 pairs warm up
            t0 = time.perf_counter()
            conn.request("POST", "/v1/completions", body, headers)
            r = conn.getresponse()
            answer = json.loads(r.read())
            t1 = time.perf_counter()
            loop.run_until_complete(engine.generate(f"direct-{i}", list(ids), params))
            t2 = time.perf_counter()
            assert r.status == 200 and answer["usage"]["completion_tokens"] == 1, answer
            if i >= 3:
                server_s.append(t1 - t0)
                engine_s.append(t2 - t1)
    finally:
        conn.close()
        child.terminate()
        child.wait(30)
        loop.close()
        engine.shutdown()
    p50_server, p50_engine = statistics.median(server_s) * 1e3, statistics.median(engine_s) * 1e3
    return {"pairs": pairs, "prompt_tokens": prompt, "server_p50_ms": round(p50_server, 2),
            "engine_p50_ms": round(p50_engine, 2), "overhead_p50_ms": round(p50_server - p50_engine, 2),
            "paired_diff_median_ms": round(statistics.median(a - b for a, b in zip(server_s, engine_s)) * 1e3, 2),
            "target_ms": 5.0, "met": p50_server - p50_engine <= 5.0}


def plot(rows: list[dict], path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = [r for r in rows if r["mode"] == mode]
        cs = [r["concurrency"] for r in rs]
        a.plot(cs, [r["output_tokens_per_s"] for r in rs], marker="o", label=mode)
        b.plot(cs, [r["e2e_ms"]["p50"] for r in rs], marker="o", label=mode)
    for ax, title in ((a, "output tokens/s"), (b, "e2e latency p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.legend()
    b.set_yscale("log")
    fig.suptitle(f"tinystack serve: GPT-2-124M shape ({rows[0].get('n_layer', '?')} layers), CPU")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the full run: --n-layer 12 --concurrency 1,4,16,64 "
                                                        "--pairs 60")
    ap.add_argument("--concurrency", default=None, help="default 1,4,16 (--full: 1,4,16,64)")
    ap.add_argument("--modes", default="continuous,dynamic,none")
    ap.add_argument("--n-layer", type=int, default=None, help="default 4 (--full: 12)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=None, help="default 30 (--full: 60)")
    ap.add_argument("--skip-load", action="store_true", help="only the HTTP overhead")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--serve-only", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.concurrency = args.concurrency or ("1,4,16,64" if args.full else "1,4,16")
    args.n_layer = args.n_layer or (12 if args.full else 4)
    args.pairs = args.pairs or (60 if args.full else 30)
    torch.set_num_threads(args.threads)
    if args.serve_only:
        return serve_only(args.serve_only)
    res = {"machine": machine(), "model": {"shape": "gpt2-124m", "n_layer": args.n_layer},
           "prompt_tokens": args.prompt, "new_tokens": args.new}
    t0 = time.perf_counter()
    res["http_overhead"] = http_overhead(args.pairs, args.prompt)
    print("HTTP overhead:", res["http_overhead"], flush=True)
    if args.skip_load:
        write_json(RESULTS / "serve_overhead.json", finish(res))
        return
    model, _ = gpt2_124m(n_layer=args.n_layer)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    rows = []
    for mode in args.modes.split(","):
        rows += load_test(model, mode, concurrencies, args.prompt, args.new)
    res["load"] = rows
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(RESULTS / "serve.json", finish(res))
    plot(rows, RESULTS / "serve.png")
    plot_percentiles(rows, RESULTS / "serve_latency.png",
                     title=f"tinystack serve latency: GPT-2-124M shape, {args.n_layer} layers, "
                           f"{args.prompt}+{args.new} tokens per request, CPU")
    print(f"wrote {RESULTS / 'serve.json'}, serve.png and serve_latency.png ({res['wall_s']} s)")


if __name__ == "__main__":
    main()
