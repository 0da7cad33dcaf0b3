"""What a request cost: device seconds priced per device-hour, and per-key totals from the request log.

Basis. The engine shares every step's wall seconds (and process CPU seconds) across
the sequences in the step by the tokens they fed (tinystack.infer.step_stats), so a
request's `device_s` is its share of the time the device (the CPU here, a GPU
elsewhere) was busy, and the shares of all requests add up to the engine's busy
time. Renting the device costs `price_per_device_hour` whether it is busy or not;
pricing only busy seconds gives the *marginal* cost of a request at full
utilisation (idle time is a capacity decision, not a request's cost):

    cost_usd       = device_s x price_per_device_hour / 3600
    cost per 1k    = cost_usd / (prompt_tokens + completion_tokens) x 1000

The default price, 0.085 USD per hour, is roughly the on-demand price of a
2-vCPU x86 cloud instance (e.g. AWS c6i.large in us-east-1); set
`serve.price_per_device_hour` for your hardware (a GPU hour costs 10-100x more).

`summarize_log(lines)` totals the "request" lines of a request log by key id
(what `tinystack cost --log FILE` prints).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

DEFAULT_PRICE_PER_DEVICE_HOUR = 0.085


def cost_usd(device_s: float, price_per_device_hour: float) -> float:
    """The price of `device_s` busy device seconds."""
    return device_s * price_per_device_hour / 3600.0


def cost_per_1k_tokens(cost: float, tokens: int) -> float | None:
    """USD per 1,000 tokens (prompt + completion); None without tokens."""
    return cost / tokens * 1000.0 if tokens > 0 else None


@dataclass
class KeyTotals:
    """One API key id's totals over a request log."""

    key_id: str
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    device_s: float = 0.0
    cpu_s: float = 0.0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_per_1k_tokens(self) -> float | None:
        return cost_per_1k_tokens(self.cost_usd, self.tokens)


def read_log(path: Path | str) -> Iterator[dict]:
    """The JSON objects of a request log, skipping lines that are not JSON objects (a torn last line)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                yield row


def summarize_log(rows: Iterable[dict]) -> list[KeyTotals]:
    """Totals per key id of the "request" lines that carry a cost (generation requests), by cost, highest first."""
    totals: dict[str, KeyTotals] = {}
    for row in rows:
        if row.get("event") != "request" or "cost_usd" not in row:
            continue
        key = str(row.get("key_id") or "anonymous")
        t = totals.setdefault(key, KeyTotals(key))
        t.requests += 1
        t.failed += 1 if row.get("failure") else 0
        t.prompt_tokens += int(row.get("prompt_tokens_computed") or 0)
        t.completion_tokens += int(row.get("completion_tokens") or 0)
        t.device_s += float(row.get("device_s") or 0.0)
        t.cpu_s += float(row.get("cpu_s") or 0.0)
        t.cost_usd += float(row.get("cost_usd") or 0.0)
    return sorted(totals.values(), key=lambda t: (-t.cost_usd, t.key_id))
