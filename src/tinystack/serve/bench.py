"""A bounded load generator for the OpenAI endpoint: closed-loop concurrency or Poisson arrivals.

    run_load(url, concurrency=C, num_requests=N, ...)       closed loop: C clients, each sends its
                                                            next request when its last one ends
    run_load(url, rate=R, concurrency=C, num_requests=N)    Poisson: requests arrive at R/s
                                                            (exponential gaps), at most C in flight
    -> per request: status, TTFT (first streamed token), e2e, output tokens, and the
       server's own timing (the final chunk's `timing` object: queue / prefill / decode ms)
    -> summary(results, elapsed): requests/s, output tokens/s, p50/p90/p99 of TTFT,
       TPOT ((e2e - TTFT) / (tokens - 1)) and e2e latency in ms, and the latency
       breakdown: p50 of the server's queue, prefill and decode time, and which dominates
    -> breakdown_line(row): "queue 1.2 | prefill 30.5 | decode 210.0 ms p50 -> decode dominates (87%)"
    -> plot_percentiles(rows, path): PNG of e2e (and TTFT) p50/p90/p99 against concurrency

A request that spends most of its time queueing needs more concurrency (max_num_seqs),
not a faster model; one dominated by prefill wants chunked prefill / shorter prompts;
decode-dominated is the model's speed per token.

Every request streams (`stream: true`, `stream_options.include_usage`) so TTFT is
measured at the client, where a user feels it. Bounded: N requests at most, and
nothing new is sent after `max_seconds`.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from tinystack.atomic import atomic_open


@dataclass
class Result:
    status: int
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    timing: dict[str, Any] | None = None  # the server's timing object (ms) from the final chunk


async def one_request(client: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    t0 = time.perf_counter()
    ttft, tokens, timing = None, 0, None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                              "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            await r.aread()
            return Result(r.status_code, None, time.perf_counter() - t0, 0)
        done = False
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            if not line.startswith("data: ") or done:
                continue
            try:
                chunk = json.loads(line[6:])
            except ValueError:  # a frame cut off mid-line: the connection ended under the stream
                break
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            timing = chunk.get("timing", timing)
            if "error" in chunk:
                return Result(500, ttft, time.perf_counter() - t0, tokens, timing)
    # a stream that ended without [DONE] was cut: counted with the streams that ended in an error event
    return Result(200 if done else 500, ttft, time.perf_counter() - t0, tokens, timing)


async def run_load(url: str, make_body: Callable[[int], dict[str, Any]], *, concurrency: int, num_requests: int,
                   rate: float | None = None, max_seconds: float = 120.0, seed: int = 0,
                   headers: dict[str, str] | None = None) -> tuple[list[Result], float]:
    """(results, elapsed seconds). `make_body(i)` gives request i's body (without stream fields)."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: list[Result] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits,
                                 headers=headers) as client:
        if rate is None:
            counter = iter(range(num_requests))

            async def worker() -> None:
                for i in counter:
                    if time.perf_counter() - t0 > max_seconds:
                        return
                    results.append(await one_request(client, make_body(i)))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            slots = asyncio.Semaphore(concurrency)

            async def send(i: int) -> None:
                async with slots:
                    results.append(await one_request(client, make_body(i)))

            tasks = []
            for i in range(num_requests):
                if time.perf_counter() - t0 > max_seconds:
                    break
                tasks.append(asyncio.create_task(send(i)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    if len(values) == 1:
        v = round(values[0] * 1e3, 2)
        return {"p50": v, "p90": v, "p99": v}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(q[49] * 1e3, 2), "p90": round(q[89] * 1e3, 2), "p99": round(q[98] * 1e3, 2)}


def summary(results: list[Result], elapsed_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200]
    tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.ttft_s is not None and r.output_tokens > 1]
    return {"requests": len(results), "ok": len(ok), "errors": {str(s): sum(r.status == s for r in results)
                                                              for s in sorted({r.status for r in results}) if s != 200},
            "elapsed_s": round(elapsed_s, 3), "requests_per_s": round(len(ok) / elapsed_s, 3),
            "output_tokens_per_s": round(tokens / elapsed_s, 2),
            "ttft_ms": _pcts([r.ttft_s for r in ok if r.ttft_s is not None]), "tpot_ms": _pcts(tpot),
            "e2e_ms": _pcts([r.e2e_s for r in ok]), **breakdown(ok)}


SEGMENTS = ("queue", "prefill", "decode")


def breakdown(ok: list[Result]) -> dict[str, Any]:
    """p50 (ms) of the server-side queue / prefill / decode time, and the segment with the largest p50."""
    p50 = {}
    for seg in SEGMENTS:
        values = [r.timing[f"{seg}_ms"] for r in ok if r.timing and r.timing.get(f"{seg}_ms") is not None]
        p50[seg] = round(statistics.median(values), 2) if values else None
    known = {k: v for k, v in p50.items() if v is not None}
    dominant = max(known, key=known.__getitem__) if known else None
    share = round(known[dominant] / sum(known.values()), 3) if dominant and sum(known.values()) > 0 else None
    return {"breakdown_p50_ms": p50, "dominant": dominant, "dominant_share": share}


def breakdown_line(row: dict[str, Any]) -> str:
    """One line: the p50 of each segment and which dominates."""
    p50 = row.get("breakdown_p50_ms") or {}
    parts = " | ".join(f"{seg} {p50[seg]:.1f}" if p50.get(seg) is not None else f"{seg} -" for seg in SEGMENTS)
    if row.get("dominant") is None:
        return f"{parts} ms p50 (no server timing)"
    return f"{parts} ms p50 -> {row['dominant']} dominates ({row['dominant_share']:.0%})"


def plot_percentiles(rows: list[dict[str, Any]], path: Any, title: str = "") -> None:
    """PNG: e2e and TTFT latency p50/p90/p99 against concurrency, one colour per mode (rows' "mode", if any)."""
    # deferred: matplotlib only when a figure is drawn
    from tinystack.plotting import pyplot

    plt = pyplot()


    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    modes = list(dict.fromkeys(r.get("mode", "") for r in rows))
    for color, mode in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], modes):
        rs = sorted((r for r in rows if r.get("mode", "") == mode), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in rs]
        for ax, key in zip(axes, ("e2e_ms", "ttft_ms")):
            for q, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ys = [r[key][q] if r[key][q] is not None else float("nan") for r in rs]
                ax.plot(cs, ys, style, marker="o", color=color, label=f"{mode} {q}".strip())
    for ax, name in zip(axes, ("e2e latency (ms)", "time to first token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent clients")
        ax.set_title(f"{name}: p50 solid, p90 dashed, p99 dotted")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
