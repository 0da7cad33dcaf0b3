"""The HTTP API's request and response bodies (pydantic v2).

Static limits live on the fields; limits that depend on the server's `ServeConfig`
(`max_tokens <= max_tokens_limit`, prompt length in characters and tokens) are
checked by the `validated_request` dependency (deps.py), before the request waits
for a concurrency slot. Fields are strict: `"5"` is not an integer and `1.5` is not
one either, but `5.0` is (JSON Schema's "integer", which /openapi.json states, is any number
with no fraction, and OpenAI accepts it: the body is parsed so, exact_json.py); unknown fields are
rejected, so a typo never silently falls back to a default. /openapi.json is the served one (openapi.py):
these models' schemas with the limits of the server's config and model filled in.

The sampling fields are not written here: `sampling_fields` makes them from SamplingParams' table
(infer/sampler.py's KNOBS: name, type, default, range, description), for /generate here and for the OpenAI
bodies (openai_schemas.py), so a parameter and its range are declared once and /openapi.json states them.

Every request body is a `RequestBody`: before any field is looked at, the whole raw body
(values and keys, at any depth) is searched for an unpaired UTF-16 surrogate (JSON allows
`"\\ud800"`, but it is no Unicode text: the tokenizer, the log and the JSON answer cannot
encode it). One is refused as an `unpaired_surrogate` error naming its place, which
errors.py answers with 400 `invalid_unicode` on every route.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic_core import PydanticCustomError

from tinystack.sampling_params import KNOBS, Knob

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
UNPAIRED_SURROGATE = "unpaired_surrogate"
# json.loads joins a valid pair into one code point, so any surrogate left in a str is unpaired
_SURROGATE = re.compile("[\ud800-\udfff]")
# A token id of the served model: 0 here; its maximum (the vocabulary's last id) is filled into the served
# schema (openapi.py) where this mark stands, and checked per request (requests.check_token_ids)
TOKEN_ID_MARK = "x-token-id"
TokenId = Annotated[int, Field(ge=0, json_schema_extra={TOKEN_ID_MARK: True})]


def printable(text: str) -> str:
    """`text` with its surrogates as \\udXXX escapes (safe to put in a message, a log or a JSON answer)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def surrogate_path(value: Any) -> tuple[str, ...] | None:
    """Where an unpaired surrogate is in a parsed JSON value (a key or a string), or None.
    Iterative: a body nested as deep as the JSON parser allows must not overflow the stack here."""
    todo: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while todo:
        item, path = todo.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return (*path, key)
                todo.append((child, (*path, str(key))))
        elif isinstance(item, list):
            todo.extend((child, (*path, str(i))) for i, child in enumerate(item))
    return None


class RequestBody(BaseModel):
    """Base of every request body: strict fields, no unknown ones, text that is valid Unicode."""

    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        path = surrogate_path(data)
        if path is not None:
            where = printable(".".join(path)) or "request body"
            raise PydanticCustomError(UNPAIRED_SURROGATE, "{param}: text holds an unpaired UTF-16 surrogate "
                                                          "(escaped as \\ud800-\\udfff); send valid Unicode",
                                      {"param": where})
        return data


def knob_field(knob: Knob, default: Any = ..., description: str | None = None) -> tuple[Any, Any]:
    """A pydantic field definition (type, Field) of one sampling parameter: its range as Field constraints;
    `default` / `description` replace the table's where a request means something else by omitting it."""
    default = knob.default if default is ... else default
    return (knob.kind if default is not None else Optional[knob.kind],
            Field(default, description=description or knob.doc, **knob.bounds))


def sampling_fields(exclude: tuple[str, ...] = (), **defaults: Any) -> dict[str, Any]:
    """Field definitions of every sampling parameter but `exclude`, for pydantic's create_model."""
    return {name: knob_field(knob, defaults.get(name, ...)) for name, knob in KNOBS.items() if name not in exclude}


JsonSchema = dict[str, Any]


def _set(name: str) -> dict[str, Any]:
    """JSON Schema: `name` is given and set (json_object: true; the others: not null)."""
    return {"required": [name], "properties": {name: {"const": True} if name == "json_object" else
                                               {"not": {"type": "null"}}}}


class StructuredOutputsBody(BaseModel):
    """vLLM's `structured_outputs` (extra body): exactly one of these constrains the output."""

    model_config = {**STRICT, "json_schema_extra": {"oneOf": [_set(k) for k in
                                                              ("json", "json_object", "regex", "choice", "grammar")]}}
    json_: Union[JsonSchema, str, None] = Field(None, alias="json", description="A JSON Schema (or its text).")
    json_object: bool | None = Field(None, description="true: any JSON object.")
    regex: str | None = Field(None, description="The whole output matches this regex (llguidance's syntax).")
    choice: list[str] | None = Field(None, min_length=1, description="The output is one of these strings.")
    grammar: str | None = Field(None, description="A grammar in llguidance's Lark syntax.")


# logprobs: /generate's answer has no logprobs
GENERATE_EXCLUDES = ("logprobs",)
GenerateRequest = create_model(
    "GenerateRequest", __base__=RequestBody, __doc__="POST /generate body: a prompt and every sampling parameter.",
    prompt=(str, Field(description="Text to continue; prompt tokens + max_tokens must fit the model's context.")),
    structured_outputs=(Optional[StructuredOutputsBody], Field(None, description="What the text must match "
                                                                                 "(exactly one kind).")),
    **sampling_fields(exclude=GENERATE_EXCLUDES))


class Timing(BaseModel):
    """Milliseconds, rounded to 0.01 (see tinystack.observe.timing); null when not measured.

    validate + queue + prefill + decode + respond = total; inference = prefill + decode;
    ttft = arrival -> first token; tpot = decode / (tokens - 1). cpu_ms / device_ms /
    cost_usd: the request's share of the engine steps it took part in (tinystack.observe.cost)."""

    validate_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    respond_ms: float | None = None
    inference_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    total_ms: float | None = None
    cpu_ms: float | None = None
    device_ms: float | None = None
    cost_usd: float | None = None


class GenerateResponse(BaseModel):
    """POST /generate answer. `tokens` are the generated ids only (not the prompt's)."""

    text: str
    tokens: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length", "cancelled"]
    degraded: bool = False  # the engine failed and this is the configured fallback answer
    timing: Timing


class ErrorDetail(BaseModel):
    """`type` is the error class (invalid_request_error, timeout_error, ...); `code` the exact case;
    `param` the request field at fault, when there is one."""

    message: str
    type: str
    param: str | None = None
    code: str


class ErrorResponse(BaseModel):
    """Every non-2xx answer has this body."""

    error: ErrorDetail


class HealthResponse(BaseModel):
    """GET /health: is the engine loop alive and stepping, and how loaded is the server.

    Answered on the event loop without waiting for anything; 503 when `status` is not "ok"."""

    status: Literal["ok", "dead", "stalled"]
    engine_alive: bool
    last_step_age_s: float  # since the engine last made progress (0 when idle)
    running: int  # sequences generating
    waiting: int  # sequences queued in the engine
    in_flight: int  # sequences admitted by the server (running + queued)
    capacity: int  # max_num_seqs + max_queued_requests
    kv_bytes_in_use: int
    breaker: Literal["closed", "open", "half_open"]
    engine_restarts: int
    max_num_seqs: int
    max_seq_len: int
    draining: bool
    replicas_up: int | None = None  # engine replicas up / asked for (serve/replicas); None: one process
    replicas_total: int | None = None
