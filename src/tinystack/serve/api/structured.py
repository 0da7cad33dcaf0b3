"""A request's output constraint: `response_format` / `structured_outputs` -> StructuredOutputs, checked by compiling.

    response_format {"type": "text"} or absent      -> no constraint
    response_format {"type": "json_object"}         -> StructuredOutputs(json_object=True)
    response_format {"type": "json_schema", ...}    -> StructuredOutputs(json=schema) (no schema: any object)
    structured_outputs {exactly one of json, json_object, regex, choice, grammar}
                                                    -> StructuredOutputs of that kind

Both fields constraining at once, or tools with a non-text response_format, is a 400 (one answer cannot match
two constraints). `check_constraint` compiles the request's constraint with the engine's tokenizer (the engine
caches it, so the compile is not repeated when the request is added): anything llguidance refuses (an invalid
JSON Schema, an unsupported keyword, a bad regex, a Lark syntax error) or that takes longer than
[infer] structured_compile_timeout_s is a 400 naming the field it came from, before anything is queued.
It may block for that long: callers run it off the event loop.
"""
from __future__ import annotations

from typing import Any

from tinystack.infer.structured import GrammarError, UnsupportedTokenizer
from tinystack.sampling_params import SamplingParams, StructuredOutputs
from tinystack.serve.api.errors import INVALID_CONSTRAINT, ApiError
from tinystack.serve.api.schemas import StructuredOutputsBody
from tinystack.serve.state import ServerState


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param=param)


def from_structured_outputs(body: StructuredOutputsBody) -> StructuredOutputs:
    """vLLM's field -> StructuredOutputs; not exactly one kind set is a 400 naming `structured_outputs`."""
    given = {k: v for k, v in (("json", body.json_), ("json_object", body.json_object), ("regex", body.regex),
                               ("choice", body.choice), ("grammar", body.grammar)) if v not in (None, False)}
    if len(given) != 1:
        raise _invalid("structured_outputs", "structured_outputs takes exactly one of json, json_object, regex, "
                                             f"choice, grammar; got {', '.join(given) or 'none'}")
    kind, value = next(iter(given.items()))
    try:
        return StructuredOutputs(**{kind: value})
    except ValueError as e:
        raise _invalid("structured_outputs", str(e)) from None


def constraint_of(body: Any) -> tuple[StructuredOutputs | None, str | None]:
    """The constraint a body asks for with `response_format` or `structured_outputs`, and that field's name."""
    rf, so = getattr(body, "response_format", None), getattr(body, "structured_outputs", None)
    constrained_rf = rf is not None and rf.type != "text"
    if constrained_rf and so is not None:
        raise _invalid("structured_outputs", "give response_format or structured_outputs, not both")
    if so is not None:
        return from_structured_outputs(so), "structured_outputs"
    if not constrained_rf:
        return None, None
    if rf.type == "json_object":
        return StructuredOutputs(json_object=True), "response_format"
    schema = rf.json_schema.schema_
    if schema is None:
        return StructuredOutputs(json_object=True), "response_format"
    return StructuredOutputs(json=schema), "response_format"


def check_constraint(state: ServerState, params: SamplingParams, param: str) -> None:
    """Compile params.structured_outputs (cached by the engine); a 400 naming `param` when it cannot be. Blocks up
    to [infer] structured_compile_timeout_s: call it off the event loop."""
    if params.structured_outputs is None:
        return
    try:
        state.adapter.compile_constraint(params)
    except UnsupportedTokenizer as e:
        raise ApiError(400, f"{param}: {e}", "structured_outputs_unsupported", param=param) from None
    except GrammarError as e:
        raise ApiError(400, f"{param}: cannot be compiled ({e.kind}): {e.reason}", INVALID_CONSTRAINT,
                       param=param) from None
