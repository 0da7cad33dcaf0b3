"""OpenAI tools -> what the model is asked (the template's `tools`) and how its answer is constrained.

Calls are written in the model's own format (infer/chat_tools.tool_call_format: HERMES, LLAMA3_JSON; docs/serve.md):

    HERMES        <tool_call>{"name": "<function>", "arguments": <JSON matching its parameters>}</tool_call>
    LLAMA3_JSON   {"name": "<function>", "parameters": <JSON matching its parameters>}

    tool_choice "none"                  no constraint; the answer is plain text (nothing is parsed)
    tool_choice "auto" (the default)    a structural tag: free text until the model writes the format's trigger
                                        (<tool_call>, or {"name" for LLAMA3_JSON), then the call's name and
                                        arguments are constrained; plain answers are never constrained
    tool_choice "required"              a Lark grammar: the whole answer is one or more calls (one when
                                        parallel_tool_calls is false or the format holds one), one right after
                                        the other
    {"type": "function", ...}           the same grammar with that one function, exactly one call

`parallel_tool_calls: false` with "auto" cannot be said in a structural tag: the answer's calls after the first
are dropped when it is parsed (tool_parser.py). Refused with a 400 naming the field: tool_choice without tools,
tool_choice naming a function that is not in tools, two tools with one name, a response_format other than text
with tools (unless tool_choice is "none"); `parameters` not of type object is refused with the body
(tool_schemas.py).
The arguments schemas themselves are checked by compiling the constraint (structured.check_constraint).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tinystack.infer.chat_tools import HERMES, ToolCallFormat
from tinystack.sampling_params import StructuredOutputs
from tinystack.serve.api.errors import CONFLICTING_FIELDS, ApiError

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolPlan:
    """What a chat request's tools mean for its prompt, its constraint and its answer."""

    tools: list[dict[str, Any]]  # OpenAI tool dicts, for the chat template
    choice: str  # none | auto | required | named
    constraint: StructuredOutputs | None = None
    max_calls: int | None = None  # calls kept when the answer is parsed (None: all)
    schemas: dict[str, dict] = field(default_factory=dict)  # function name -> its arguments' schema
    format: ToolCallFormat = HERMES  # how the model writes a call (its template's)

    @property
    def parse(self) -> bool:
        """Calls are parsed out of the answer (not with tool_choice "none")."""
        return self.choice != "none"


def _invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code, param=param)


def _lit(text: str) -> str:
    return json.dumps(text)  # Lark string literals take JSON's escapes


def calls_grammar(schemas: dict[str, dict], many: bool, fmt: ToolCallFormat = HERMES) -> str:
    """A Lark grammar (llguidance's, with %json) for an answer that is only calls: one, or one or more."""
    # calls follow each other with nothing between: after a call the model's only choices are another call or
    # EOS (with a newline allowed, SmolLM2 takes it and is then forced into a second call it did not want)
    rules = [f"start: call{'+' if many else ''}",
             "call: " + " | ".join(f"c{i}" for i in range(len(schemas)))]
    for i, (name, schema) in enumerate(schemas.items()):
        rules.append(f"c{i}: {_lit(fmt.begin(name))} a{i} {_lit(fmt.end)}")
        rules.append(f"a{i}: %json {json.dumps(schema)}")
    return "\n".join(rules) + "\n"


def structural_tag(schemas: dict[str, dict], fmt: ToolCallFormat = HERMES) -> dict[str, Any]:
    """vLLM's structural tag for tool_choice "auto": any text, and after the format's trigger one of the functions."""
    return {"triggers": [fmt.trigger],
            "structures": [{"begin": fmt.begin(name), "schema": schema, "end": fmt.end}
                           for name, schema in schemas.items()]}


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel: bool, response_format: Any,
               fmt: ToolCallFormat) -> ToolPlan | None:
    """A chat body's tools, tool_choice and parallel_tool_calls, for a model that calls in `fmt` -> ToolPlan (None:
    no tools); 400s as listed in the module docstring."""
    if not tools:
        if tool_choice is not None and tool_choice != "none":
            raise _invalid("tool_choice", "tool_choice needs tools: this request lists none")
        return None
    schemas: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.function
        if fn.name in schemas:
            raise _invalid("tools", f"tools[{i}]: a second function named {fn.name!r}", CONFLICTING_FIELDS)
        schemas[fn.name] = NO_ARGUMENTS if fn.parameters is None else fn.parameters  # type object (tool_schemas)
    choice = "auto" if tool_choice is None else tool_choice if isinstance(tool_choice, str) else "named"
    if choice == "named" and tool_choice.function.name not in schemas:
        raise _invalid("tool_choice", f"tool_choice names the function {tool_choice.function.name!r}, which is not "
                                      f"in tools ({', '.join(schemas)})", CONFLICTING_FIELDS)
    if choice != "none" and response_format is not None and response_format.type != "text":
        raise _invalid("response_format", "response_format other than text cannot be combined with tools "
                                          "(unless tool_choice is \"none\")", CONFLICTING_FIELDS)
    dicts = [t.model_dump(exclude_none=True, by_alias=True) for t in tools]
    many = parallel and fmt.parallel
    plan = ToolPlan(dicts, choice, schemas=schemas, max_calls=None if many else 1, format=fmt)
    if choice == "auto":
        plan.constraint = StructuredOutputs(structural_tag=structural_tag(schemas, fmt))
    elif choice == "required":
        plan.constraint = StructuredOutputs(grammar=calls_grammar(schemas, many, fmt))
    elif choice == "named":
        name = tool_choice.function.name
        plan.constraint = StructuredOutputs(grammar=calls_grammar({name: schemas[name]}, False, fmt))
        plan.max_calls = 1
    return plan
