"""A bounded load generator for the OpenAI endpoint: closed-loop concurrency or Poisson arrivals.

    run_load(url, concurrency=C, num_requests=N, ...)       closed loop: C clients, each sends its
                                                            next request when its last one ends
    run_load(url, rate=R, concurrency=C, num_requests=N)    Poisson: requests arrive at R/s
                                                            (exponential gaps), at most C in flight
    -> per request: status, TTFT (first streamed token), e2e, output tokens
    -> summary(results, elapsed): requests/s, output tokens/s, and p50/p90/p99 of
       TTFT, TPOT ((e2e - TTFT) / (tokens - 1)) and e2e latency, in ms

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


@dataclass
class Result:
    status: int
    ttft_s: float | None
    e2e_s: float
    output_tokens: int


async def one_request(client: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                              "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            await r.aread()
            return Result(r.status_code, None, time.perf_counter() - t0, 0)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if "error" in chunk:
                return Result(500, ttft, time.perf_counter() - t0, tokens)
    return Result(200, ttft, time.perf_counter() - t0, tokens)


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
            "e2e_ms": _pcts([r.e2e_s for r in ok])}
