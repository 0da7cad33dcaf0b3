"""Observability: what happened to each request, how long each part took, and what it cost.

Data flow for one served request (the serving layer calls; everything is defined here):

    server sees it   -> RequestRecord + RequestTiming.mark("arrival")        (record.py, timing.py)
    body valid       -> mark("validated");  asks for a slot -> mark("enqueued")
    engine           -> per sequence, finished or aborted: SequenceUsage (tokens, and the
                        engine's own RequestMetrics: perf_counter stamps scheduled / first /
                        last token, CPU and device seconds shared by tokens) -> RequestUsage (usage.py)
                     -> marks scheduled, first_token, last_token
    response done    -> mark("returned"); to_dict(): validate / queue / prefill / decode /
                        respond (summing to total), inference, ttft, tpot in ms
    after sending    -> Observer.finish(record), once every sequence reported its cost   (observer.py)
                        -> Prometheus metrics in the app's own registry                   (metrics.py)
                        -> RequestLog: one JSON line, queued, written on a thread          (logs.py)
                        -> OpenTelemetry spans, when configured                            (tracing.py)
                        -> cost = device seconds x price per device-hour                   (cost.py)
    all the time     -> GC pauses (gc.callbacks), event-loop lag, batch size per step    (jitter.py)
    later            -> `tinystack cost --log FILE`: totals per API key from the log    (commands.py)

Timing is cheap and exact (one monotonic clock, points enforced in order); logging
never blocks the caller (I/O happens on a listener thread). Prompt/output text is
not logged unless asked for.
"""
from tinystack.observe.logs import TEXT_FIELDS, JsonLineFormatter, RequestLog, setup_request_log
from tinystack.observe.timing import TIMING_POINTS, RequestTiming, TimingError

__all__ = ["TEXT_FIELDS", "TIMING_POINTS", "JsonLineFormatter", "RequestLog", "RequestTiming", "TimingError",
           "setup_request_log"]
