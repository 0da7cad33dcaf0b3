"""Request fields for structured outputs and tools (pydantic v2): OpenAI's `response_format`, `tools`,
`tool_choice` and an assistant message's `tool_calls` (vLLM's `structured_outputs` extra is in schemas.py: /generate
takes it too).

Only shapes are checked here (so /openapi.json describes them); what needs the grammar engine (is this a JSON
Schema llguidance can compile, a valid regex, a Lark grammar) is checked when the request is prepared
(serve/api/structured.py, serve/api/tools.py), a 400 naming the field.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, field_validator

from tinystack.serve.api.schemas import STRICT, JsonSchema, StructuredOutputsBody

__all__ = ["ResponseFormat", "StructuredOutputsBody", "Tool", "ToolCall", "ToolChoice"]

FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                                    description="Letters, digits, _ . - (at most 64), as OpenAI allows.")]


class TextFormat(BaseModel):
    model_config = STRICT
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = STRICT
    name: str = Field(max_length=64)
    schema_: JsonSchema | None = Field(None, alias="schema", description="The JSON Schema the answer matches; "
                                                                        "omitted: any JSON object.")
    strict: bool | None = Field(None, description="Accepted; the answer always matches the schema.")
    description: str | None = None


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaFormat], Field(discriminator="type")]


class FunctionDef(BaseModel):
    model_config = STRICT
    name: FunctionName
    description: str | None = None
    parameters: JsonSchema | None = Field(None, description="A JSON Schema of type object; omitted: no arguments.",
                                          json_schema_extra={"anyOf": [{"type": "null"}, {
                                              "type": "object", "required": ["type"],
                                              "properties": {"type": {"const": "object"}}}]})
    strict: bool | None = Field(None, description="Accepted; arguments always match `parameters`.")

    @field_validator("parameters")
    @classmethod
    def _an_object_schema(cls, value: JsonSchema | None) -> JsonSchema | None:
        """The schema's own rule (the field's anyOf), wherever tools are taken (/tokenize too)."""
        if value is not None and value.get("type") != "object":
            raise ValueError('must be a JSON Schema with "type": "object"')
        return value


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDef


class FunctionRef(BaseModel):
    model_config = STRICT
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionRef


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class CalledFunction(BaseModel):
    model_config = STRICT
    name: str
    arguments: str = Field(description="The arguments as JSON text, as the answer gave them.")


class ToolCall(BaseModel):
    """A call in an assistant message of the history (what an answer's `message.tool_calls` holds)."""

    model_config = STRICT
    id: str
    type: Literal["function"]
    function: CalledFunction
