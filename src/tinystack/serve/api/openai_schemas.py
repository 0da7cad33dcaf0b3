"""Request bodies of the OpenAI-compatible endpoints (pydantic v2), and their extras.

The fields are OpenAI's (https://platform.openai.com/docs/api-reference), plus vLLM-style extras that the
`openai` client sends with `extra_body`: `top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`,
`stop_token_ids`, `priority`, and `timeout`
(seconds; may only lower the server's timeout). The sampling fields (temperature, top_p, seed, the
penalties, top_k, min_p, ...) are made from SamplingParams' table (schemas.sampling_fields): their names,
defaults and ranges (OpenAI's where it has the field, else vLLM's) are declared once, in infer/sampler.py;
`logprobs` keeps each endpoint's own shape (completions: an int; chat: a bool + `top_logprobs`), with the
table's range. Unknown fields are rejected at every level, inside
`messages[]` too (a typo must not fall back to a default silently); the fields of
OpenAI's answer message that this server never produces (`refusal`, `audio`, ...)
are accepted as null, which is what a client echoes back. Strings are not numbers;
integer fields take 5.0 as 5 (exact_json.py). The rules between fields are in the schema too (`_FIELD_RULES`,
`CHAT_TEMPLATE_RULES`, the chat body's own: stream_options needs stream, one constraint field, top_logprobs
needs logprobs, tool_choice needs tools, continue_final_message needs add_generation_prompt false), and the
served /openapi.json fills in the config's and the model's limits (openapi.py); what no JSON Schema can say is
checked in requests.py, with the numbers in the message (docs/serve.md lists it).
Structured outputs and tools (tool_schemas.py): `response_format` (text, json_object, json_schema) and vLLM's
`structured_outputs` on both endpoints; `tools`, `tool_choice`, `parallel_tool_calls` and the history's
`tool_calls` / `tool` turns on chat. What only the grammar engine can judge is checked in requests.py.
Responses are plain dicts built in openai_service.py, in OpenAI's shapes.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model

from tinystack.infer.chat import RESERVED
from tinystack.sampling_params import KNOBS, LOGIT_BIAS_MAX
from tinystack.serve.api.schemas import STRICT, TOKEN_ID_MARK, RequestBody, TokenId, knob_field, sampling_fields
from tinystack.serve.api.tool_schemas import ResponseFormat, StructuredOutputsBody, Tool, ToolCall, ToolChoice

# continue_final_message: true needs add_generation_prompt: false (it defaults to true)
CHAT_TEMPLATE_RULES = [{"if": {"required": ["continue_final_message"], "properties": {"continue_final_message":
                                                                                     {"const": True}}},
                        "then": {"required": ["add_generation_prompt"],
                                 "properties": {"add_generation_prompt": {"const": False}}}}]
# the names the chat template gets from the server itself are not the request's to set (infer.chat.RESERVED)
TEMPLATE_KWARGS: dict[str, Any] = {"propertyNames": {"not": {"enum": sorted(RESERVED)}}}
MIN_TIMEOUT_S = 1e-3  # a request's own timeout below a millisecond is no timeout a clock here can keep: a 400
StopText = Annotated[str, Field(min_length=1)]
Stop = Union[StopText, Annotated[list[StopText], Field(max_length=4)], None]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


def _given(name: str, value: dict[str, Any] | None = None) -> dict[str, Any]:
    """JSON Schema: `name` is given, not null (and matches `value`)."""
    given: dict[str, Any] = {"not": {"type": "null"}}
    return {"required": [name], "properties": {name: {"allOf": [given, value]} if value else given}}


# The rules between fields, in /openapi.json as JSON Schema (the checks themselves: requests.py, structured.py,
# tools.py; a client generated from the schema meets them)
_FIELD_RULES: list[dict[str, Any]] = [
    {"if": _given("stream_options"), "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}},
    {"not": {"allOf": [_given("structured_outputs"),  # one constraint: response_format or structured_outputs
                       _given("response_format", {"properties": {"type": {"enum": ["json_object", "json_schema"]}}})
                       ]}}]


class _Fields(RequestBody):
    """The fields of /v1/completions and /v1/chat/completions that are not sampling parameters."""

    model_config = ConfigDict(json_schema_extra={"allOf": _FIELD_RULES})

    model: str | None = Field(None, max_length=256, description="Any value; this server serves one model.")
    n: int = Field(1, ge=1, le=128, description="Choices; at most ServeConfig.max_n.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = Field(None, description="Up to 4 non-empty strings; the text ends before the first one found.")
    user: str | None = Field(None, max_length=256)
    logit_bias: dict[str, Annotated[float, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX)]] | None = Field(
        None, json_schema_extra={TOKEN_ID_MARK: "keys"}, description="Token id (as a string) -> bias in "
                                                                    "[-100, 100], added to its logit before sampling.")
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = Field(
        None, max_length=64, description="vLLM's extra: token ids that end the output like EOS (not included); ids "
                                         "of this model's vocabulary.")
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1, description="vLLM's extra: lower is served first (admitted "
                                                                    "first, preempted last); equal: first come, "
                                                                    "first served.")
    timeout: float | None = Field(None, ge=MIN_TIMEOUT_S, le=3600.0, description="Seconds; only lowers the server's "
                                                                               "(an answer not done by then is a "
                                                                               "504).")
    response_format: ResponseFormat | None = Field(None, description="text (default), json_object, or "
                                                                     "json_schema: the answer matches it.")
    structured_outputs: StructuredOutputsBody | None = Field(None, description="vLLM's extra: exactly one of "
                                                                               "json, json_object, regex, choice, "
                                                                               "grammar.")


# logprobs: each endpoint's own shape, below; max_tokens: omitted = the server's default (requests.prepare)
OPENAI_EXCLUDES = ("logprobs",)
_MAX_TOKENS = "Default: ServeConfig.default_max_tokens, capped by what fits in the context."
_Sampling = create_model("_Sampling", __base__=_Fields, __doc__="Fields shared by /v1/completions and "
                         "/v1/chat/completions.", **{**sampling_fields(exclude=OPENAI_EXCLUDES),
                                                     "max_tokens": knob_field(KNOBS["max_tokens"], None, _MAX_TOKENS)})


MAX_PROMPTS = 256  # prompts in one completion request (each runs n choices)


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value)


def _prompt_kind(value: object) -> str:
    """Which form of `prompt` a body has, so a refusal speaks of that form only (a bad id in a batch is not a
    string too many). The tags are the union-branch names errors.py leaves out of `param`."""
    if _is_ids(value):
        return "list[int]"
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "list[list[int]]"
    return "list[str]" if isinstance(value, list) else "str"


Ids = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Annotated[Union[Annotated[str, Tag("str")],
                            Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS), Tag("list[str]")],
                            Annotated[Ids, Tag("list[int]")],
                            Annotated[list[Ids], Field(min_length=1, max_length=MAX_PROMPTS),
                                      Tag("list[list[int]]")]],
                      Discriminator(_prompt_kind)] = Field(
        description="A string, token ids (as /tokenize gives them), or a batch of either: each prompt gets n "
                    "choices, choice i*n+j answering prompt i (OpenAI's order).")
    logprobs: int | None = knob_field(KNOBS["logprobs"])[1]
    echo: bool = Field(False, description="The answer starts with its prompt; with logprobs, the prompt's tokens "
                                          "scored too (the first has none): what lm-evaluation-harness' "
                                          "loglikelihood requests read.")


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


_ECHOED = "Accepted as null only: a field of OpenAI's answer message that this server never produces."


class ChatMessage(BaseModel):
    """One message. The template sees `role`, `content`, an assistant's `tool_calls` and a tool turn's
    `tool_call_id` (infer/chat.py); `name` is accepted and unused."""

    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_call_id: str | None = None
    # what `client.chat.completions.create(...).choices[0].message.model_dump()` adds to an answer
    refusal: None = Field(None, description=_ECHOED)
    annotations: None = Field(None, description=_ECHOED)
    audio: None = Field(None, description=_ECHOED)
    function_call: None = Field(None, description=_ECHOED)
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant turn's calls (its content may be "
                                                                 "null).")


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions. `max_completion_tokens` is `max_tokens`' newer name: given both, it wins (vLLM)."""

    # Five rules between fields is what schemathesis' generator (jsonschema_rs) can still expand on a body this
    # size: "tools with a response_format other than text need tool_choice none" is checked per request only
    model_config = ConfigDict(json_schema_extra={"allOf": [
        *_FIELD_RULES, *CHAT_TEMPLATE_RULES,
        {"if": _given("top_logprobs"), "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
        {"if": _given("tool_choice", {"not": {"const": "none"}}),  # tool_choice (but "none") needs tools
         "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}}]})

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="Same as max_tokens (the newer name); "
                                                                      "given both, this one counts.")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, description="The n most likely tokens' logprobs; needs logprobs: true.",
                                     **KNOBS["logprobs"].bounds)
    tools: list[Tool] | None = Field(None, max_length=128, description="Functions the model may call.")
    tool_choice: ToolChoice | None = Field(None, description="none | auto (default with tools) | required | "
                                                             "{type: function, function: {name}}.")
    parallel_tool_calls: bool = Field(True, description="false: at most one call per answer.")
    add_generation_prompt: bool = Field(True, description="vLLM's extra: end the prompt with the assistant's turn "
                                                          "opening (false: the conversation as written).")
    continue_final_message: bool = Field(False, description="vLLM's extra: the prompt ends inside the last "
                                                            "message, which the model continues (a prefilled "
                                                            "answer); needs add_generation_prompt: false.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, json_schema_extra=TEMPLATE_KWARGS, description="vLLM's extra: more variables for the chat template (e.g. "
                                                             "enable_thinking); names it does not read are ignored.")
