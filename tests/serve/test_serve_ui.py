"""The playground and dashboard pages (serve/ui.py, serve/static/): served, open, and in step with /metrics.

The browser itself is driven in test_serve_ui_browser.py; here plain HTTP checks that
the pages and their scripts are served, that nothing else under /ui/ is, and that every
metric name the dashboard's script reads is one the server's /metrics exposes, with
the type the script expects (the contract between the two, read from the script's
METRICS block, not copied here).
"""
from __future__ import annotations

import re

import httpx
from serve_helpers import PROMPT

from tinystack.serve.ui.pages import STATIC_DIR

METRICS_BLOCK = re.compile(r"export const METRICS = \{(.*?)\n\};", re.S)
METRIC_ENTRY = re.compile(r'(\w+):\s*\{\s*name:\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)",\s*type:\s*"(\w+)"\s*\}')
TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


def dashboard_metrics() -> dict[str, tuple[str, str]]:
    """key -> (metric name, Prometheus type), parsed from the constant block at the top of dashboard.js."""
    block = METRICS_BLOCK.search((STATIC_DIR / "dashboard.js").read_text(encoding="utf-8"))
    assert block, "dashboard.js has no `export const METRICS = {...};` block"
    entries = {key: (name, kind) for key, name, kind in METRIC_ENTRY.findall(block.group(1))}
    assert len(entries) == block.group(1).count("name:"), \
        "an entry of METRICS is not `key: { name: \"..\", type: \"..\" }`"
    return entries


def test_pages_and_assets_are_served_without_a_key(serve, engine, monkeypatch):
    monkeypatch.setenv("TS_UI_TEST_KEYS", "sekret")
    s = serve(engine, api_key_env="TS_UI_TEST_KEYS")
    with httpx.Client(base_url=s.url, timeout=10) as c:
        for path, script in (("/", "/ui/playground.js"), ("/dashboard", "/ui/dashboard.js")):
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["content-type"].startswith("text/html")
            assert f'src="{script}"' in r.text and 'href="/ui/ui.css"' in r.text
        for name in ("ui.js", "ui.css", "playground.js", "dashboard.js", "prom.js", "timing.js"):
            r = c.get(f"/ui/{name}")
            assert r.status_code == 200, name
            want = "text/css" if name.endswith(".css") else "text/javascript"
            assert r.headers["content-type"].split(";")[0] == want
            assert r.text == (STATIC_DIR / name).read_text(encoding="utf-8")
        # only plain .js/.css names from the static folder: no traversal, no other files
        for bad in ("/ui/nothing.js", "/ui/playground.html", "/ui/..%2Fui.py", "/ui/%2E%2E%2Fapp.py"):
            assert c.get(bad).status_code == 404, bad
        # the API itself still wants the key
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 401
        # and the pages are not in the OpenAPI schema
        paths = c.get("/openapi.json").json()["paths"]
        assert not {"/", "/dashboard", "/ui/{name}"} & set(paths)


def test_dashboard_metric_names_match_the_servers_metrics(serve, async_engine):
    expected = dashboard_metrics()
    assert {"running", "waiting", "kvUsage", "batchSize", "e2eLatency", "ttft", "generationTokens",
            "failures"} <= set(expected)
    s = serve(async_engine)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        for seed in range(3):  # some traffic first, so that every series has been touched
            assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "seed": seed}).status_code == 200
        r = c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain"), "the dashboard reads the Prometheus text format"
    types = dict(TYPE_LINE.findall(r.text))
    for key, (name, kind) in expected.items():
        # a counter's TYPE line may be under the name without _total (OpenMetrics style)
        found = types.get(name) or (types.get(name.removesuffix("_total")) if kind == "counter" else None)
        assert found == kind, f"METRICS.{key}: /metrics has no {kind} {name} (TYPE lines: {sorted(types)})"
    samples = {line.split("{")[0].split(" ")[0] for line in r.text.splitlines() if line and not line.startswith("#")}
    for key, (name, kind) in expected.items():
        if kind == "histogram":
            assert {f"{name}_bucket", f"{name}_sum", f"{name}_count"} <= samples, key
        elif key != "failures":  # a labelled counter has no series before its first failure
            assert name in samples, key
