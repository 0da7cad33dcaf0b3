"""The Prometheus metrics of one server, in their own CollectorRegistry (never the global one).

    per request   (Observer, after the response and the engine's cost report)
        histograms  tinystack_time_to_first_token_seconds, _time_per_output_token_seconds,
                    _e2e_request_latency_seconds, _request_{queue,prefill,decode}_time_seconds
                    (successful generation requests)
        counters    tinystack_prompt_tokens_total{model}, _generation_tokens_total{model} (every
                    request, aborted and timed-out ones too: the engine computed those tokens),
                    _request_success_total{finished_reason}, _request_failures_total{reason},
                    _request_{cost_usd,device_seconds,cpu_seconds}_total{key_id,model}
                    (model: the served model's name, or the LoRA adapter's that answered)
    per HTTP request  tinystack_http_requests_total{route,status}   (route template: bounded labels)
    per engine step   tinystack_batch_size                          (the engine's step listener)
    jitter            tinystack_gc_pause_seconds{generation}, tinystack_event_loop_lag_seconds (jitter.py)
    at scrape time    gauges tinystack_num_requests_running, _waiting, tinystack_kv_cache_usage (0-1);
                      counters tinystack_num_preemptions_total, _prefix_cache_{hits,queries}_total
                      (prompt tokens), tinystack_spec_{proposed,accepted}_tokens_total (speculative
                      decoding's draft tokens), read from the engine by `EngineCollector`

Latency buckets run from 1 ms to 60 s (a tiny model answers in milliseconds, a big
one under load in seconds). Every metric object is thread-safe (the engine thread
and the GC callback write too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FINISH_REASONS = ("stop", "length", "abort")
FAILURE_REASONS = ("validation", "overloaded", "timeout", "aborted", "engine_error")


@dataclass(frozen=True)
class EngineReading:
    """What the engine shows at scrape time; counters are totals since the engine started."""

    running: int
    waiting: int
    kv_usage: float  # 0-1
    preemptions: int = 0
    prefix_cache_hits: int = 0  # prompt tokens served from the prefix cache
    prefix_cache_queries: int = 0  # prompt tokens looked up in it
    spec_proposed_tokens: int = 0  # speculative decoding: draft tokens the target checked
    spec_accepted_tokens: int = 0  # ... and accepted (acceptance rate = accepted / proposed)


class EngineCollector(Collector):
    """Gauges and engine counters read at scrape time from `read()` (None: the server is not running; a dict:
    one reading per engine replica, each series labelled `replica`).

    Counters are reported relative to the first reading, so a server that reuses an
    engine (tests, restarts) counts only its own traffic."""

    def __init__(self, read: Callable[[], EngineReading | dict[str, EngineReading] | None]) -> None:
        self.read = read
        self._base: EngineReading | None = None

    def start(self) -> None:
        """The server started: count the engine's counters from here."""
        r = self.read()
        self._base = r if isinstance(r, EngineReading) else None

    def collect(self) -> Iterable[Metric]:
        r = self.read()
        labels = ["replica"] if isinstance(r, dict) else []
        running = GaugeMetricFamily("tinystack_num_requests_running", "Sequences the engine is generating now.",
                                    labels=labels)
        waiting = GaugeMetricFamily("tinystack_num_requests_waiting", "Sequences queued inside the engine.",
                                    labels=labels)
        kv = GaugeMetricFamily("tinystack_kv_cache_usage", "Share of the KV cache in use (0-1).", labels=labels)
        pre = CounterMetricFamily("tinystack_num_preemptions", "Sequences preempted (KV cache full).", labels=labels)
        hits = CounterMetricFamily("tinystack_prefix_cache_hits", "Prompt tokens served by the prefix cache.",
                                   labels=labels)
        queries = CounterMetricFamily("tinystack_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      labels=labels)
        proposed = CounterMetricFamily("tinystack_spec_proposed_tokens",
                                       "Speculative draft tokens checked by the target model.", labels=labels)
        accepted = CounterMetricFamily("tinystack_spec_accepted_tokens",
                                       "Speculative draft tokens the target model accepted.", labels=labels)
        families = [running, waiting, kv, pre, hits, queries, proposed, accepted]
        if isinstance(r, dict):  # engine replicas (serve/replicas): each started fresh, so counters are totals
            for rid, one in sorted(r.items()):
                self._add(one, EngineReading(0, 0, 0.0), [rid], *families)
        elif r is not None:
            self._add(r, self._base or r, [], *families)
            self._base = self._base or r
        return families

    @staticmethod
    def _add(r: EngineReading, base: EngineReading, labels: list[str], running: Metric, waiting: Metric,
             kv: Metric, pre: Metric, hits: Metric, queries: Metric, proposed: Metric, accepted: Metric) -> None:
        running.add_metric(labels, r.running)
        waiting.add_metric(labels, r.waiting)
        kv.add_metric(labels, min(1.0, max(0.0, r.kv_usage)))
        pre.add_metric(labels, max(0, r.preemptions - base.preemptions))
        hits.add_metric(labels, max(0, r.prefix_cache_hits - base.prefix_cache_hits))
        queries.add_metric(labels, max(0, r.prefix_cache_queries - base.prefix_cache_queries))
        proposed.add_metric(labels, max(0, r.spec_proposed_tokens - base.spec_proposed_tokens))
        accepted.add_metric(labels, max(0, r.spec_accepted_tokens - base.spec_accepted_tokens))


class ServeMetrics:
    """Every metric of one server; `render()` is the body of GET /metrics."""

    def __init__(self, read_engine: Callable[[], EngineReading | None] = lambda: None) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.engine = EngineCollector(read_engine)
        r.register(self.engine)

        def hist(name: str, doc: str, buckets: tuple = LATENCY_BUCKETS, labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=r)

        self.ttft = hist("tinystack_time_to_first_token_seconds", "Arrival to the first token.")
        self.tpot = hist("tinystack_time_per_output_token_seconds", "Decode time per output token after the first.",
                         TPOT_BUCKETS)
        self.e2e = hist("tinystack_e2e_request_latency_seconds", "Arrival to the response returned.")
        self.queue = hist("tinystack_request_queue_time_seconds", "Enqueued to first scheduled by the engine.")
        self.prefill = hist("tinystack_request_prefill_time_seconds", "First scheduled to the first token.")
        self.decode = hist("tinystack_request_decode_time_seconds", "First token to the last token.")
        self.batch_size = hist("tinystack_batch_size", "Sequences per engine step.", BATCH_BUCKETS)
        self.gc_pause = hist("tinystack_gc_pause_seconds", "Garbage-collector pauses.", PAUSE_BUCKETS, ("generation",))
        self.loop_lag = hist("tinystack_event_loop_lag_seconds", "How late the event loop woke a sleeping task.",
                             LATENCY_BUCKETS)
        self.prompt_tokens = counter("tinystack_prompt_tokens", "Prompt tokens computed (aborted requests too).",
                                     ("model",))
        self.generation_tokens = counter("tinystack_generation_tokens", "Tokens generated (aborted requests too).",
                                         ("model",))
        self.success = counter("tinystack_request_success", "Finished sequences by finish reason.",
                               ("finished_reason",))
        self.failures = counter("tinystack_request_failures", "Failed generation requests by reason.", ("reason",))
        self.http = counter("tinystack_http_requests", "HTTP requests by route template and status.",
                            ("route", "status"))
        per_key = ("key_id", "model")
        self.cost = counter("tinystack_request_cost_usd", "Cost of requests (device seconds x price).", per_key)
        self.device_s = counter("tinystack_request_device_seconds", "Device (wall) seconds of engine steps, "
                                "shared by tokens.", per_key)
        self.cpu_s = counter("tinystack_request_cpu_seconds", "Process CPU seconds of engine steps, shared by tokens.",
                             per_key)
        for reason in FINISH_REASONS:  # labelled series exist (at 0) from the start
            self.success.labels(reason)
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)

    def serving(self, model: str) -> None:
        """The served model's token counters exist (at 0) from the start."""
        self.prompt_tokens.labels(model)
        self.generation_tokens.labels(model)

    def observe_step(self, batch_size: int) -> None:
        self.batch_size.observe(batch_size)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
