"""OpenTelemetry spans per request, when the `[otel]` extra is installed and an exporter is configured.

    make_tracer("")                      -> None: nothing imported, nothing recorded
    make_tracer("console" | "otlp")      -> RequestTracer with its own TracerProvider (not the
                                            global one) and a BatchSpanProcessor (export on a
                                            background thread, never on the event loop)
    make_tracer(..., span_exporter=X)    -> X behind a SimpleSpanProcessor (tests: InMemorySpanExporter)

    RequestTracer.emit(request_id, points, attributes) once the request is done:

        tinystack.request     arrival   -> returned
          ├─ validate         arrival   -> validated
          ├─ queue            enqueued  -> scheduled
          ├─ prefill          scheduled -> first_token
          ├─ decode           first_token -> last_token
          └─ respond          last_token  -> returned

Spans are built after the fact from the request's timing points (one clock,
perf_counter, converted to epoch nanoseconds), so tracing adds nothing to the
request's own path; a span whose points were not reached is left out. Every span
carries `tinystack.request_id`. "otlp" needs opentelemetry-exporter-otlp-proto-http.
"""
from __future__ import annotations

import time
from typing import Any

from tinystack.errors import require

SPANS: tuple[tuple[str, str, str], ...] = (("validate", "arrival", "validated"), ("queue", "enqueued", "scheduled"),
                                           ("prefill", "scheduled", "first_token"),
                                           ("decode", "first_token", "last_token"),
                                           ("respond", "last_token", "returned"))
EXPORTERS = ("", "console", "otlp")


class RequestTracer:
    """Writes the spans of finished requests through one TracerProvider (see the module docstring)."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("tinystack.serve")

    def emit(self, request_id: str, points: dict[str, float], attributes: dict[str, Any] | None = None) -> None:
        """The request's spans from its timing points (perf_counter seconds)."""
        from opentelemetry import trace

        if "arrival" not in points or "returned" not in points:
            return
        offset = time.time_ns() - time.perf_counter_ns()  # perf_counter -> epoch ns

        def ns(point: str) -> int:
            return offset + int(points[point] * 1e9)

        attrs = {"tinystack.request_id": request_id, **{k: v for k, v in (attributes or {}).items() if v is not None}}
        root = self.tracer.start_span("tinystack.request", start_time=ns("arrival"), attributes=attrs)
        parent = trace.set_span_in_context(root)
        for name, first, last in SPANS:
            if first in points and last in points:
                span = self.tracer.start_span(name, context=parent, start_time=ns(first),
                                              attributes={"tinystack.request_id": request_id})
                span.end(end_time=ns(last))
        root.end(end_time=ns("returned"))

    def flush(self) -> None:
        """Export what is buffered (the server stops; it may be served again)."""
        self.provider.force_flush()


def make_tracer(exporter: str, span_exporter: Any = None) -> RequestTracer | None:
    """A RequestTracer for `exporter` ("" = off) or for a given SpanExporter; raises ValueError for an
    unknown exporter and MissingExtra (with the fix) when the extra is missing."""
    if exporter not in EXPORTERS:
        raise ValueError(f"otel_exporter must be one of {EXPORTERS}, got {exporter!r}")
    if not exporter and span_exporter is None:
        return None
    require("opentelemetry.sdk", "otel", "serve.otel_exporter (OpenTelemetry spans)")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "tinystack"}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        exporters = require("opentelemetry.exporter.otlp.proto.http.trace_exporter", "otel",
                            "serve.otel_exporter = 'otlp'")
        OTLPSpanExporter = exporters.OTLPSpanExporter
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return RequestTracer(provider)
