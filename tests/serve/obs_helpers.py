"""Helpers for the observability tests: read a server's /metrics (Prometheus text) as numbers."""
import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, headers: dict | None = None) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} of every sample GET /metrics exposes (parsed with
    prometheus_client's own parser)."""
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    """One sample's value (0.0 when the series does not exist yet)."""
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))), 0.0)


def total(samples: dict, name: str, **labels) -> float:
    """Sum of every series of `name` whose labels include `labels`."""
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))
