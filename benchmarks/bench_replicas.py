"""Replicas benchmark: the gateway in front of engine replicas on Ray Serve (serve/replicas) vs one process.

A random GPT (BPE tokenizer trained here, 4 x 256, context 512; `--quick`: 2 x 64, context 256) is
written as a model directory and served four ways, all on this machine, all driven by our load
generator (tinystack.serve.bench) over HTTP on 127.0.0.1:

    overhead    p50 latency of a 1-token request (non-streaming, keep-alive) through the gateway with
                1 replica minus p50 through the single-process server (`tinystack serve`), as
                interleaved pairs in one run (target <= 5 ms)
    scaling     1 vs 2 replicas (least-loaded routing): requests/s, output tokens/s, e2e p50/p99 and
                TTFT p99 at 16 and 64 clients, closed loop, 16 new tokens (ignore_eos). On 2 cores the
                second replica adds no compute: what it can change is tail latency and isolation
    routing     prefix-aware vs round robin with 2 replicas: a workload of 4 shared system prompts
                (4 KV blocks each) + a unique question; prefix-cache hit rate (hit / looked-up prompt
                tokens, over both replicas) and TTFT p50/p99. Fresh system prompts for each policy, so
                neither starts with a warm cache
    failover    8 streaming clients; one of 2 replicas killed (ray.kill): seconds until /health says 2
                replicas up again, requests refused before they started (must be 0 but for 429s) and
                streams cut (started on the lost replica: an error event)

Writes benchmarks/results/replicas.json. The machine is shared: load averages are recorded.

    .venv/bin/python benchmarks/bench_replicas.py [--quick] [--overhead-only] [--clients 16,64] [--pairs 40]

--overhead-only measures the overhead alone (1 replica; -> replicas_overhead[_quick].json).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402
from tinystack.config import Config  # noqa: E402
from tinystack.model import GPT, GPTConfig  # noqa: E402
from tinystack.model.io import save_model  # noqa: E402
from tinystack.serve import create_app, run_in_background  # noqa: E402
from tinystack.serve.bench import run_load, summary  # noqa: E402
from tinystack.serve.engine.adapter import load_engine  # noqa: E402
from tinystack.serve.replicas import deploy  # noqa: E402
from tinystack.tokenizer import BPETokenizer  # noqa: E402

WORDS = ("return the number of items in the list value error if key is missing default none this module "
         "provides a small parser for config files and raises when input is invalid").split()


def write_model(path: Path, quick: bool) -> None:
    rng = random.Random(0)
    tok = BPETokenizer.train([" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + f" {i}."
                              for i in range(600)], vocab_size=400)
    torch.manual_seed(0)
    layers, width, ctx = (2, 64, 256) if quick else (4, 256, 512)
    save_model(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=ctx, n_layer=layers, n_head=4, n_embd=width)),
               path, eos_token_id=tok.eos_token_id)
    tok.save(path)


def config(replicas: int, routing: str = "least_loaded") -> Config:
    cfg = Config()
    s = cfg.serve
    s.replicas, s.routing, s.replica_num_cpus = replicas, routing, 1.0
    # the load, not the server's protection, is what is measured (as `bench serve --model`)
    s.max_queued_requests, s.timeout_s, s.stall_timeout_s = 256, 600.0, 600.0
    cfg.infer.max_num_seqs, cfg.infer.weight_format, cfg.infer.hugepages = 32, "float32", False
    return cfg


def p50_ms(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(n):
            t0 = time.perf_counter()
            r = c.post("/v1/completions", json={"prompt": f"return the {i}", "max_tokens": 1, "temperature": 0})
            assert r.status_code == 200, r.text
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def overhead(single: str, gateway: str, pairs: int) -> dict:
    p50_ms(single, 5), p50_ms(gateway, 5)  # warm both
    a, b = [], []
    for _ in range(pairs):  # interleaved: both see the same moment of a shared machine
        a += p50_ms(single, 1)
        b += p50_ms(gateway, 1)
    sa, sb = statistics.median(a), statistics.median(b)
    return {"single_p50_ms": round(sa, 2), "gateway_p50_ms": round(sb, 2), "overhead_p50_ms": round(sb - sa, 2),
            "pairs": pairs, "target_ms": 5.0}


def load(url: str, clients: int, make_body, n: int) -> dict:
    results, elapsed = asyncio.run(run_load(url, make_body, concurrency=clients, num_requests=n, max_seconds=300))
    s = summary(results, elapsed)
    return {k: s[k] for k in ("requests", "ok", "errors", "requests_per_s", "output_tokens_per_s", "e2e_ms",
                              "ttft_ms")}


def system_prompts(seed: int, words: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(4)]


def routing_run(url: str, adapter, seed: int, clients: int, n: int, words: int) -> dict:
    prompts = system_prompts(seed, words)
    before = adapter.stats()
    body = lambda i: {"prompt": f"{prompts[i % 4]} question {seed}-{i}?", "max_tokens": 8, "ignore_eos": True}
    row = load(url, clients, body, n)
    time.sleep(1.0)  # the replicas' counters reach the gateway with their next routing stats
    after = adapter.stats()
    hits, queries = (after.prefix_cache_hits - before.prefix_cache_hits,
                     after.prefix_cache_queries - before.prefix_cache_queries)
    return {**row, "prefix_hit_rate": round(hits / max(1, queries), 3), "hit_tokens": hits, "query_tokens": queries}


def failover(url: str, clients: int, seconds_before: float) -> dict:
    import ray

    stop = threading.Event()
    results: list = []

    async def client(c: int) -> None:
        from tinystack.serve.bench import one_request

        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            i = 0
            while not stop.is_set():
                results.append(await one_request(http, {"prompt": f"return {c} {i}", "max_tokens": 24,
                                                        "ignore_eos": True}))
                i += 1

    async def drive() -> None:
        await asyncio.gather(*(client(c) for c in range(clients)))

    t = threading.Thread(target=lambda: asyncio.run(drive()), daemon=True)
    t.start()
    time.sleep(seconds_before)
    victim = sorted(_ids(url))[0]
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{deploy.APP_NAME}#{deploy.DEPLOYMENT}#{victim}", namespace="serve"),
             no_restart=True)
    killed = time.monotonic()
    time.sleep(0.5)
    # Serve lists a killed replica until its controller has seen the death: back means 2 up, the victim not one
    while httpx.get(url + "/health").json().get("replicas_up") != 2 or victim in _ids(url):
        time.sleep(0.1)
    back_s = time.monotonic() - killed
    time.sleep(2.0)
    stop.set()
    t.join(120)
    statuses = [r.status for r in results]
    return {"clients": clients, "replicas_back_after_s": round(back_s, 2), "requests": len(results),
            "ok": statuses.count(200), "refused_before_start": sum(s not in (200, 500, 429) for s in statuses),
            "rejected_429": statuses.count(429), "streams_cut": statuses.count(500)}


def _ids(url: str) -> list[str]:
    text = httpx.get(url + "/metrics").text
    return [line.split('replica="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("tinystack_num_requests_running{replica=")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: tiny model, few requests, 1 trial")
    ap.add_argument("--overhead-only", action="store_true", help="only the gateway overhead (1 replica)")
    ap.add_argument("--clients", default="16,64")
    ap.add_argument("--pairs", type=int, default=40)
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    pairs = min(args.pairs, 8) if args.quick and not args.overhead_only else args.pairs
    per_level = (lambda c: c) if args.quick else (lambda c: 4 * c)
    res: dict = {"machine": machine(), "quick": args.quick}
    with TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        write_model(model, args.quick)
        started = deploy.connect("", 2, 1.0)
        try:
            cfg1 = config(1)
            engine = load_engine(model, cfg1.infer)
            handle = deploy.deploy(model, cfg1)
            adapter = deploy.gateway_adapter(handle, model, cfg1)
            body = lambda i: {"prompt": f"return the number of items {i}", "max_tokens": 16, "ignore_eos": True}
            with run_in_background(create_app(engine, cfg1.serve, model_dir=model)) as single, \
                    run_in_background(create_app(adapter, cfg1.serve, model_dir=model), startup_timeout_s=60) as gw:
                res["overhead"] = overhead(single, gw, pairs)
                print("overhead", res["overhead"], flush=True)
                if not args.overhead_only:
                    res["scaling"] = [{"replicas": 1, "clients": c, **load(gw, c, body, per_level(c))}
                                      for c in clients]
            engine.shutdown()
            if not args.overhead_only:
                two_replicas(model, res, args.quick, clients, per_level, body)
        finally:
            deploy.shutdown(started)
    name = "replicas_overhead" if args.overhead_only else "replicas"
    out = RESULTS / (f"{name}_quick.json" if args.quick else f"{name}.json")
    write_json(out, finish(res))
    print(f"wrote {out}")


def two_replicas(model: Path, res: dict, quick: bool, clients: list[int], per_level, body) -> None:
    """Scaling at 2 replicas, routing policies and failover (into `res`)."""
    cfg2 = config(2)
    handle = deploy.deploy(model, cfg2)  # scale to 2 (same model: no restart of the first)
    adapter = deploy.gateway_adapter(handle, model, cfg2)
    with run_in_background(create_app(adapter, cfg2.serve, model_dir=model), startup_timeout_s=60) as gw:
        res["scaling"] += [{"replicas": 2, "clients": c, **load(gw, c, body, per_level(c))} for c in clients]
        for row in res["scaling"]:
            print("scaling", row, flush=True)
    res["routing"] = []
    words = 40 if quick else 80  # about 4 blocks of 16 tokens of shared prompt
    for trial, policy in enumerate(["prefix", "round_robin"] * (1 if quick else 3)):
        cfgp = config(2, policy)
        handle = deploy.deploy(model, cfgp)
        adapter = deploy.gateway_adapter(handle, model, cfgp)
        with run_in_background(create_app(adapter, cfgp.serve, model_dir=model), startup_timeout_s=60) as gw:
            n = 32 if quick else 128
            res["routing"].append({"policy": policy, "trial": trial,
                                   **routing_run(gw, adapter, 100 + trial, 8, n, words)})
            print("routing", res["routing"][-1], flush=True)
            if trial == 0:
                res["failover"] = failover(gw, 8, 3.0 if quick else 10.0)
                print("failover", res["failover"], flush=True)


if __name__ == "__main__":
    main()
