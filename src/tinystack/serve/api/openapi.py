"""The served /openapi.json: the request models' schemas with this server's limits filled in.

The pydantic models (schemas.py, openai_schemas.py, ...) state every rule that holds on any server: types,
ranges, one-of, the rules between fields. What depends on the config and the model is filled in here, once the
server has started, so a client generated from the schema sends what this server accepts:

    max_tokens, max_completion_tokens, min_tokens   maximum = min(serve.max_tokens_limit, context - 1)
    n                                               maximum = serve.max_n
    the sampling parameters' bounds                 exactly as their table states them (FastAPI writes floats)
    token ids (schemas.TOKEN_ID_MARK)               maximum = the vocabulary's last id
    logit_bias keys                                 propertyNames: a decimal number of a token id (pattern)

What a JSON Schema cannot say is checked per request only, each with its own 400 (docs/serve.md lists them):
a prompt's length in tokens (context_length_exceeded), min_tokens above the request's max_tokens, a constraint
the grammar engine cannot compile, what the chat template refuses, tool names (unique, tool_choice's in tools),
a batch of prompts x n beyond what the server can hold.
"""
from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tinystack.sampling_params import KNOBS, Knob
from tinystack.serve.api.schemas import TOKEN_ID_MARK


def token_id_pattern(last: int) -> str:
    """A regex for the decimal numbers 0..last (leading zeros allowed, as int() reads them), ASCII digits only."""

    def upto(d: str, first: bool) -> list[str]:  # numbers of len(d) digits, <= d, no leading 0 when first
        lo = 1 if first else 0
        if len(d) == 1:
            return [f"[{lo}-{d}]"] if int(d) >= lo else []
        out = [f"[{lo}-{int(d[0]) - 1}][0-9]{{{len(d) - 1}}}"] if int(d[0]) > lo else []
        return [*out, f"{d[0]}(?:{'|'.join(upto(d[1:], False))})"]

    digits = str(last)
    shorter = [f"[1-9][0-9]{{{n - 1}}}" if n > 1 else "[1-9]" for n in range(1, len(digits))]
    positive = [*shorter, *upto(digits, True)] if last >= 1 else []
    return f"^(?:0+|0*(?:{'|'.join(positive)}))$" if positive else "^0+$"


def _cap(node: dict[str, Any], maximum: int) -> None:
    """Lower an integer schema's maximum (also inside an anyOf: an optional field)."""
    if node.get("type") == "integer":
        node["maximum"] = min(node.get("maximum", maximum), maximum)
    for branch in node.get("anyOf", []):
        _cap(branch, maximum)


# FastAPI's OpenAPI model holds bounds as floats: 2**63 - 1 (seed's maximum) comes out as 2**63, which the field
# refuses. The sampling parameters' bounds are put back exactly from their table (JSON Schema's names for pydantic's)
_BOUND_KEYWORDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _exact_bounds(prop: dict[str, Any], knob: Knob) -> None:
    for branch in [prop, *prop.get("anyOf", [])]:
        if branch.get("type") in ("integer", "number"):
            branch.update({_BOUND_KEYWORDS[k]: knob.kind(v) for k, v in knob.bounds.items()})


def _fill(node: Any, caps: dict[str, int], last_token: int) -> None:
    if isinstance(node, list):
        for item in node:
            _fill(item, caps, last_token)
        return
    if not isinstance(node, dict):
        return
    mark = node.pop(TOKEN_ID_MARK, None)
    if mark == "keys":
        node["propertyNames"] = {"pattern": token_id_pattern(last_token)}
    elif mark:
        node["maximum"] = last_token
    for name, prop in (node.get("properties") or {}).items():
        if name in KNOBS and isinstance(prop, dict):
            _exact_bounds(prop, KNOBS[name])
        if name in caps and isinstance(prop, dict):
            _cap(prop, caps[name])
    for value in node.values():
        _fill(value, caps, last_token)


def served_openapi(app: FastAPI) -> dict[str, Any]:
    """app.openapi: the schema with the limits of the running server (cached once it runs; before it starts, the
    models' own schema with no server's limits)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, description=app.description,
                         routes=app.routes)
    state = app.state.server
    if state is None:
        return schema
    schema = copy.deepcopy(schema)
    most = min(state.cfg.max_tokens_limit, state.adapter.max_seq_len - 1)
    caps = {"max_tokens": most, "max_completion_tokens": most, "min_tokens": most, "n": state.cfg.max_n}
    _fill(schema.get("components", {}), caps, state.adapter.tokenizer.vocab_size - 1)
    app.openapi_schema = schema
    return schema
