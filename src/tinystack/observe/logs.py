"""Structured request logs, one JSON object per line, written without ever blocking the caller.

    RequestLog.log(event, **fields)        caller's thread (e.g. the event loop): builds a LogRecord,
        -> QueueHandler -> SimpleQueue     puts it on an unbounded queue and returns at once
        -> QueueListener thread            background thread: formats the record as JSON
        -> FileHandler / StreamHandler     and does the (possibly slow) I/O

Every line has `ts` (ISO 8601, UTC, when `log()` was called), `event`, `request_id`
and `status` (null when not given), then the caller's fields. Values that JSON cannot
represent (objects, NaN, infinities) are written with `str()`, so every line is
strict JSON. Prompt and output text (fields named in `TEXT_FIELDS`) are dropped
unless the log was set up with `include_text=True`: they may be private, and they
make log lines large.

The queue is unbounded: a sink slower than the request rate costs memory, never
latency. `close()` drains the queue, writes everything, and stops the thread.
"""
from __future__ import annotations

import itertools
import json
import logging
import logging.handlers
import math
import queue
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

TEXT_FIELDS: frozenset[str] = frozenset({"prompt", "text", "output", "completion"})
_ids = itertools.count()


# Characters Python's str.splitlines() (httpx's iter_lines, many SSE and JSONL readers) breaks a line at, which
# JSON leaves raw in a string (the others it must escape): written as escapes, a record stays one line
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(obj: Any, **kwargs: Any) -> str:
    """json.dumps(obj, ensure_ascii=False) on one line for any line splitter (same value when parsed)."""
    return json.dumps(obj, ensure_ascii=False, **kwargs).translate(_LINE_BREAKS)


class JsonLineFormatter(logging.Formatter):
    """Formats a record made by `RequestLog.log` as one JSON object (no trailing newline)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds")
        line: dict[str, Any] = {"ts": ts.replace("+00:00", "Z"), "event": record.getMessage()}
        fields: dict[str, Any] = dict(getattr(record, "fields", {}))
        line["request_id"] = fields.pop("request_id", None)
        line["status"] = fields.pop("status", None)
        line.update(fields)
        try:
            return json_line(line, default=str, allow_nan=False)
        except ValueError:  # NaN / Infinity are not JSON: write them as strings
            return json_line(_finite(line), default=str)


def _finite(value: Any) -> Any:
    """`value` with every non-finite float (nan, inf) replaced by its str()."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class RequestLog:
    """A non-blocking JSON-lines log. Build it with `setup_request_log`.

    `log()` is safe to call from any thread and from the event loop; it never does
    I/O. After `close()`, `log()` is a no-op.
    """

    def __init__(self, handlers: list[logging.Handler], include_text: bool = False) -> None:
        self.include_text = include_text
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        # A private logger (not registered with logging.getLogger): no global state, no propagation.
        self._logger = logging.Logger(f"tinystack.requests.{next(_ids)}", level=logging.INFO)
        self._logger.propagate = False
        self._logger.addHandler(logging.handlers.QueueHandler(self._queue))
        self._handlers = handlers
        self._listener = logging.handlers.QueueListener(self._queue, *handlers, respect_handler_level=False)
        self._listener.start()
        self._closed = False
        self._close_lock = threading.Lock()

    def log(self, event: str, **fields: Any) -> None:
        """Queue one line: `event` plus `fields` (request_id and status go first). Returns immediately."""
        if self._closed:
            return
        if not self.include_text:
            fields = {k: v for k, v in fields.items() if k not in TEXT_FIELDS}
        self._logger.info(event, extra={"fields": fields})

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Write every queued line, stop the background thread and close the sinks. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._listener.stop()  # enqueues a sentinel and joins the thread after the queue drains
            for handler in self._handlers:
                handler.close()

    def __enter__(self) -> RequestLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def setup_request_log(path: Path | str | None, stream: IO[str] | None = None,
                      include_text: bool = False) -> RequestLog:
    """A started `RequestLog` appending JSON lines to `path` (parents created) and/or `stream`.

    With neither, lines are discarded (logging disabled). The caller
    owns the result and must `close()` it; the stream itself is not closed.
    """
    formatter = JsonLineFormatter()
    handlers: list[logging.Handler] = []
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="a", encoding="utf-8"))
    if stream is not None:
        handlers.append(logging.StreamHandler(stream))  # closing it leaves the stream open
    if not handlers:
        handlers.append(logging.NullHandler())
    for handler in handlers:
        handler.setFormatter(formatter)
    return RequestLog(handlers, include_text=include_text)

