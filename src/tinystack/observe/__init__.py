"""Observability: what happened to each request, and how long each part took.

Data flow for one served request:

    server sees it  -> RequestTiming.mark("arrival")        (timing.py)
    valid, queued   -> mark("enqueue")
    slot + worker   -> mark("start")      inference runs     -> mark("end")
    response ready  -> mark("returned")   -> to_dict(): queue_ms, inference_ms, total_ms,
                                                         prefill_ms, decode_ms (0.01 ms)
    response sent   -> RequestLog.log("request", request_id=..., status=..., **timing, ...)
                       -> in-memory queue -> background thread -> JSON line in a file/stream (logs.py)

Timing is cheap and exact (one monotonic clock, points enforced in order); logging
never blocks the caller (I/O happens on a listener thread). Prompt/output text is
not logged unless asked for.
"""
from tinystack.observe.logs import TEXT_FIELDS, JsonLineFormatter, RequestLog, setup_request_log
from tinystack.observe.timing import TIMING_POINTS, RequestTiming, TimingError

__all__ = ["TEXT_FIELDS", "TIMING_POINTS", "JsonLineFormatter", "RequestLog", "RequestTiming", "TimingError",
           "setup_request_log"]
