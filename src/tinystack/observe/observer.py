"""One server's observability: metrics, the request log, traces and cost, fed one finished request at a time.

    Observer.start(read_engine, add_step_listener)    lifespan start: GC timing (+ gc.freeze),
                                                      event-loop lag task, batch-size listener
    Observer.finish(record)                           after the response is sent; waits (without
                                                      blocking) until the engine reported every
                                                      sequence's cost, at most `settle_timeout_s`
        -> metrics (metrics.py)   -> log line (logs.py: queued, written on a thread)
        -> spans (tracing.py, when configured)
    Observer.stop()                                   lifespan end: undo start()

Failure reasons (HTTP status of a generation route, unless the server knew better):
400 / 413 / 422 validation, 429 overloaded, 504 timeout, 499 aborted (client gone),
500 / 503 or a degraded answer engine_error; 401 / 404 / 405 are not generation failures.
"""
from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any, Callable

from tinystack.observe.cost import cost_per_1k_tokens, cost_usd
from tinystack.observe.jitter import GcPauses, loop_lag
from tinystack.observe.logs import RequestLog
from tinystack.observe.metrics import EngineReading, ServeMetrics
from tinystack.observe.record import RequestRecord
from tinystack.observe.tracing import RequestTracer

_BY_STATUS = {400: "validation", 413: "validation", 422: "validation", 429: "overloaded", 504: "timeout",
              499: "aborted", 500: "engine_error", 503: "engine_error"}


def failure_reason(record: RequestRecord) -> str | None:
    """Why a generation request failed (None: it did not, or it is not a generation failure)."""
    if record.failure is not None:
        return record.failure
    if record.status is None:  # the client left before any response started
        return "aborted"
    return _BY_STATUS.get(record.status)


class Observer:
    def __init__(self, metrics: ServeMetrics | None = None, request_log: RequestLog | None = None,
                 tracer: RequestTracer | None = None, *, price_per_device_hour: float = 0.0,
                 gc_freeze: bool = False, loop_lag_interval_s: float = 0.0, settle_timeout_s: float = 10.0) -> None:
        self.metrics = metrics or ServeMetrics()
        self.request_log = request_log
        self.tracer = tracer
        self.price = price_per_device_hour
        self.gc_freeze = gc_freeze
        self.loop_lag_interval_s = loop_lag_interval_s
        self.settle_timeout_s = settle_timeout_s
        self._gc = GcPauses(self.metrics.gc_pause)
        self._lag: asyncio.Task | None = None
        self._remove_listener: Callable[[], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's event loop while it runs
        self.model_name = ""  # the served model's (a request's `model` label unless an adapter answered it)

    # ------------------------------------------------------------ lifespan
    def start(self, read_engine: Callable[[], EngineReading | None] | None = None,
              add_step_listener: Callable[[Callable[[Any], None]], Callable[[], None]] | None = None,
              model_name: str = "") -> None:
        """Call on the server's event loop once the model is loaded."""
        self.loop = asyncio.get_running_loop()
        self.model_name = model_name
        self.metrics.serving(model_name)
        if read_engine is not None:
            self.metrics.engine.read = read_engine
            self.metrics.engine.start()
        self._gc.install(freeze=self.gc_freeze)
        if self.loop_lag_interval_s > 0:
            self._lag = asyncio.get_running_loop().create_task(loop_lag(self.metrics.loop_lag,
                                                                        self.loop_lag_interval_s))
        if add_step_listener is not None:
            self._remove_listener = add_step_listener(lambda rec: self.metrics.observe_step(rec.batch_size))

    async def stop(self) -> None:
        self._gc.uninstall()
        if self._lag is not None:
            self._lag.cancel()
            with suppress(asyncio.CancelledError):
                await self._lag
            self._lag = None
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self.tracer is not None:
            self.tracer.flush()
        self.loop = None

    # ------------------------------------------------------------ requests
    def finish(self, record: RequestRecord) -> None:
        """The response was sent (or abandoned): record it now, or once its engine cost is known."""
        self.metrics.http.labels(record.route, str(record.status if record.status is not None else 499)).inc()
        usage = record.usage
        if usage is None or usage.settled:
            self._record(record)
            return
        handle = asyncio.get_running_loop().call_later(self.settle_timeout_s, usage.settle)

        def done() -> None:
            handle.cancel()
            self._record(record)

        usage.when_settled(done)

    def _record(self, rec: RequestRecord) -> None:
        m, t, usage = self.metrics, rec.timing, rec.usage
        model = rec.model or self.model_name
        failure = failure_reason(rec) if rec.generation else None
        cost: dict[str, Any] = {}
        if usage is not None:
            spent = cost_usd(usage.device_s, self.price)
            tokens = usage.prompt_tokens + usage.completion_tokens
            cost = {"prompt_tokens_computed": usage.prompt_tokens, "cpu_s": round(usage.cpu_s, 6),
                    "device_s": round(usage.device_s, 6), "cost_usd": spent,
                    "cost_per_1k_tokens": cost_per_1k_tokens(spent, tokens)}
            proposed, accepted = usage.spec_tokens
            if proposed:  # speculative decoding: this request's acceptance
                cost.update(spec_proposed_tokens=proposed, spec_accepted_tokens=accepted)
            m.prompt_tokens.labels(model).inc(usage.prompt_tokens)
            m.generation_tokens.labels(model).inc(usage.completion_tokens)
            m.cost.labels(rec.key_id, model).inc(spent)
            m.device_s.labels(rec.key_id, model).inc(usage.device_s)
            m.cpu_s.labels(rec.key_id, model).inc(usage.cpu_s)
        if rec.generation:
            if failure is not None:
                m.failures.labels(failure).inc()
                if failure in ("aborted", "timeout") and usage is not None and usage.sequences:
                    m.success.labels("abort").inc(len(usage.sequences))
            elif rec.status == 200:
                for reason in rec.finish_reasons:
                    m.success.labels(reason if reason in ("stop", "length") else "stop").inc()
                self._observe_latency(rec)
        if self.request_log is not None:
            measured = {k: v for k, v in t.to_dict().items() if v is not None}
            fields = {**rec.fields, **measured, **cost}
            if usage is not None:
                fields.setdefault("completion_tokens", usage.completion_tokens)
            fields["key_id"] = rec.key_id
            if rec.usage is not None or rec.model:
                fields["model"] = model
            if rec.generation:
                fields["failure"] = failure
            fields.pop("request_id", None)
            fields.pop("status", None)
            self.request_log.log("request", request_id=rec.request_id, status=rec.status, **fields)
        if self.tracer is not None:
            self.tracer.emit(rec.request_id, t.points, {"http.route": rec.route, "http.status_code": rec.status,
                                                        "tinystack.key_id": rec.key_id})

    def _observe_latency(self, rec: RequestRecord) -> None:
        m, t = self.metrics, rec.timing
        for hist, name in ((m.e2e, "total_ms"), (m.ttft, "ttft_ms"), (m.queue, "queue_ms"), (m.prefill, "prefill_ms"),
                           (m.decode, "decode_ms"), (m.tpot, "tpot_ms")):
            value = t.seconds(name)
            if value is not None:
                hist.observe(value)
