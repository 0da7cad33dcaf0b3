"""OpenTelemetry spans validate -> queue -> prefill -> decode -> respond per request (the SDK's in-memory
exporter), and nothing at all (no SDK import) when no exporter is configured.

(FastAPI itself imports the opentelemetry *API* when it is installed; the SDK is what tracing adds.)"""
import subprocess
import sys

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_helpers import PROMPT

from tinystack.config import ServeConfig
from tinystack.observe.tracing import make_tracer
from tinystack.serve import create_app, run_in_background

PHASES = ["validate", "queue", "prefill", "decode", "respond"]


def test_five_spans_nested_ordered_with_the_request_id(async_engine):
    exporter = InMemorySpanExporter()
    app = create_app(async_engine, ServeConfig(), span_exporter=exporter)
    with run_in_background(app, shutdown_timeout_s=5) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True},
                       headers={"x-request-id": "trace-me-1"}, timeout=30)
        assert r.status_code == 200
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("tinystack.request_id") == "trace-me-1"]
    root = next(s for s in spans if s.name == "tinystack.request")
    children = sorted((s for s in spans if s is not root), key=lambda s: s.start_time)
    assert [s.name for s in children] == PHASES
    assert root.attributes["http.route"] == "/v1/completions" and root.attributes["http.status_code"] == 200
    for s in children:
        assert s.parent.span_id == root.context.span_id and s.context.trace_id == root.context.trace_id
        assert root.start_time <= s.start_time <= s.end_time <= root.end_time
    for a, b in zip(children, children[1:]):  # in order, never overlapping
        assert a.end_time <= b.start_time
    decode = children[3]
    assert decode.end_time - decode.start_time > 0
    total_ns = root.end_time - root.start_time
    assert total_ns == pytest.approx(float(r.headers["x-total-time"]) * 1e9, abs=2e6)


def test_no_exporter_means_no_tracer_and_no_sdk_import():
    assert make_tracer("") is None
    with pytest.raises(ValueError, match="otel_exporter"):
        make_tracer("zipkin")
    code = ("import sys; from tinystack.config import ServeConfig; from tinystack.serve import create_app; "
            "from tinystack.observe.tracing import make_tracer; create_app(object(), ServeConfig()); "
            "assert make_tracer('') is None; print(any(m.startswith('opentelemetry.sdk') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
