"""POST /v1/embeddings (OpenAI's shape): the served model's hidden states pooled into one vector per input.

    {"input": str | [str] | [int] | [[int]], "encoding_format": "float" | "base64", "model", "user"}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
        "usage": {"prompt_tokens", "total_tokens"}}

Each input is tokenised as a completion prompt is (token ids are taken as given, checked against the
vocabulary) and pooled by [serve] embedding_pooling (infer/embeddings.py: the last token's state or the mean,
L2-normalised). `base64` is the float32 vector's little-endian bytes, as OpenAI sends it (the openai client asks
for it by default and decodes it). Behind the API key, the rate limits (one request, its input tokens) and the
metrics like every generation route; refused with a 400 naming `input`: an empty input, an input longer than
the model's context, more than MAX_INPUTS inputs, a token id outside the vocabulary.
"""
from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import Field

from tinystack.infer import PromptError, PromptTooLongError
from tinystack.serve.api.errors import CONTEXT_LENGTH_EXCEEDED, ApiError
from tinystack.serve.api.requests import check_token_ids
from tinystack.serve.api.schemas import RequestBody, TokenId
from tinystack.serve.state import ServerState

MAX_INPUTS = 2048  # OpenAI's limit per request

Ids = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]


class EmbeddingRequest(RequestBody):
    """POST /v1/embeddings."""

    input: Union[Text, Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)], Ids,
                 Annotated[list[Ids], Field(min_length=1, max_length=MAX_INPUTS)]] = Field(
        description="A string, a list of strings, a list of token ids, or a list of token-id lists.")
    model: str | None = Field(None, max_length=256, description="Any value; this server serves one model.")
    encoding_format: Literal["float", "base64"] = Field("float", description="float: a list of numbers; base64: "
                                                                             "the float32 bytes (little-endian).")
    user: str | None = Field(None, max_length=256)


def _invalid(message: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param="input")


def inputs_of(body: EmbeddingRequest) -> list[str | list[int]]:
    x = body.input
    if isinstance(x, str):
        return [x]
    if x and all(isinstance(t, int) for t in x):
        return [list(x)]
    return list(x)


def encode_inputs(state: ServerState, body: EmbeddingRequest) -> list[list[int]]:
    """Token ids of every input (off the event loop: long inputs tokenize for milliseconds)."""
    inputs = inputs_of(body)
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, list):
            check_token_ids(state, x, "input")
        try:
            out.append(state.adapter.encode(x))
        except PromptError as e:
            raise ApiError(400, f"input[{i}]: {e}", CONTEXT_LENGTH_EXCEEDED if isinstance(e, PromptTooLongError)
                           else "invalid_value", param="input") from None
    return out


def response(state: ServerState, body: EmbeddingRequest, ids: list[list[int]], vectors: Any) -> dict[str, Any]:
    rows = np.asarray(vectors, dtype=np.float32)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
             else row.tolist()} for i, row in enumerate(rows)]
    tokens = sum(len(x) for x in ids)
    return {"object": "list", "data": data, "model": state.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
