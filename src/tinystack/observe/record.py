"""Everything observability knows about one HTTP request, filled in as it goes through the server.

The serving layer creates one `RequestRecord` per request (serve/api/context.py extends it
into the request's context), marks its timing points, adds log fields, and hands it
to `Observer.finish` (observer.py) once the response is sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinystack.observe.timing import RequestTiming
from tinystack.observe.usage import RequestUsage


@dataclass
class RequestRecord:
    request_id: str
    timing: RequestTiming
    fields: dict[str, Any] = field(default_factory=dict)  # extra log-line fields
    usage: RequestUsage | None = None  # set when the request reached the engine
    key_id: str = "anonymous"  # short id of the API key's hash (never the key)
    model: str | None = None  # the model that answered: a LoRA adapter's name, or None for the served model
    route: str = "other"  # the route template ("/v1/completions"), never the raw path
    generation: bool = False  # a route that generates text (success / failure / latency metrics)
    failure: str | None = None  # set when the reason is known better than the status says
    finish_reasons: list[str] = field(default_factory=list)  # one per choice answered
    status: int | None = None

    def mark_returned(self) -> None:
        """Mark the `returned` point unless it already is (the response is complete)."""
        if not self.timing.is_marked("returned"):
            self.timing.mark_clamped("returned")

    def engine_usage(self) -> RequestUsage:
        """The request's usage record, created on first use (the request is going to the engine)."""
        if self.usage is None:
            self.usage = RequestUsage()
        return self.usage
