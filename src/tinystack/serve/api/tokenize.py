"""POST /tokenize and /detokenize (vLLM's extra endpoints): the token ids the server runs, and back.

    /tokenize   {"prompt": str} | {"messages": [...], "add_generation_prompt": true, "tools": [...]}
                -> {"count", "max_model_len", "tokens"}: exactly the ids /v1/completions (a prompt) or
                   /v1/chat/completions (messages, rendered by the model's chat template) would run, so a
                   client can count a prompt against the context, or find the ids to give `logit_bias`
    /detokenize {"tokens": [ids]} -> {"prompt": text}; an id outside the vocabulary is a 400 naming it

Both behind the API key like the generation routes (they reveal nothing a completion does not); the
body's size limit (max_body_bytes, 413) applies, as it does to a completion.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tinystack.infer.chat import ChatTemplateError, encode_chat
from tinystack.serve.api.errors import ApiError
from tinystack.serve.api.openai_schemas import CHAT_TEMPLATE_RULES, TEMPLATE_KWARGS, ChatMessage
from tinystack.serve.api.requests import chat_messages, check_token_ids, template_error
from tinystack.serve.api.schemas import STRICT, TokenId
from tinystack.serve.api.tool_schemas import Tool
from tinystack.serve.state import ServerState


class TokenizeRequest(BaseModel):
    """A completion prompt or a chat's messages (exactly one: the schema says so with oneOf)."""

    model_config = {**STRICT, "json_schema_extra": {"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
                                                    "allOf": CHAT_TEMPLATE_RULES}}
    model: str | None = Field(None, max_length=256, description="Any value; this server serves one model.")
    prompt: str = Field(None, description="Give this or messages.")  # type: ignore[assignment]  # absent = None
    messages: list[ChatMessage] = Field(None, min_length=1, description="Give this or prompt.")  # type: ignore
    add_generation_prompt: bool = Field(True, description="Messages only: end with the assistant's turn opening, "
                                                          "as a chat completion does.")
    tools: list[Tool] | None = Field(None, max_length=128, description="Messages only: the tools the chat template "
                                                                      "is given, as a chat completion's `tools`.")
    continue_final_message: bool = Field(False, description="Messages only: as a chat completion's.")
    chat_template_kwargs: dict[str, Any] | None = Field(None, json_schema_extra=TEMPLATE_KWARGS,
                                                        description="Messages only: as a chat completion's.")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = Field(None, max_length=256)
    tokens: list[TokenId] = Field(max_length=1_000_000)


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize(state: ServerState, body: TokenizeRequest) -> TokenizeResponse:
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "give exactly one of prompt and messages", "invalid_value", param="prompt")
    if body.continue_final_message and body.add_generation_prompt:  # the schema's rule, whichever is given
        raise ApiError(400, "continue_final_message and add_generation_prompt exclude each other (set "
                            "add_generation_prompt to false)", "invalid_value", param="continue_final_message")
    tokenizer = state.adapter.tokenizer
    if body.prompt is not None:
        ids = tokenizer.encode_ordinary(body.prompt)
    else:
        messages = chat_messages(body.messages)
        try:
            tools = [t.model_dump(exclude_none=True, by_alias=True) for t in body.tools] if body.tools else None
            prompt = state.chat.render(messages, add_generation_prompt=body.add_generation_prompt, tools=tools,
                                       continue_final_message=body.continue_final_message,
                                       template_kwargs=body.chat_template_kwargs)
        except ChatTemplateError as e:
            raise template_error(e) from None
        ids = encode_chat(tokenizer, prompt)
    return TokenizeResponse(count=len(ids), max_model_len=state.adapter.max_seq_len, tokens=ids)


def detokenize(state: ServerState, body: DetokenizeRequest) -> DetokenizeResponse:
    check_token_ids(state, body.tokens, "tokens")
    return DetokenizeResponse(prompt=state.adapter.tokenizer.decode(body.tokens))
