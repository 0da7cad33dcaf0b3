"""The HTTP API's request and response bodies (pydantic v2).

Static limits live on the fields; limits that depend on the server's `ServeConfig`
(`max_tokens <= max_tokens_limit`, prompt length in characters and tokens) are
checked by the `validated_request` dependency (deps.py), before the request waits
for a concurrency slot. Fields are strict: `"5"` is not an integer and `1.5` is not
one either; unknown fields are rejected, so a typo never silently falls back to a default.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed range we accept


class GenerateRequest(BaseModel):
    """POST /generate body. temperature 0 = greedy; top_k 0 and top_p 1 = off."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    prompt: str = Field(description="Text to continue; at most ServeConfig.max_prompt_chars characters.")
    max_tokens: int = Field(64, ge=1, description="New tokens to generate; at most ServeConfig.max_tokens_limit.")
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="Same seed + same request = same output.")


class Timing(BaseModel):
    """Milliseconds, rounded to 0.01 (see tinystack.observe.timing). queue + inference <= total."""

    queue_ms: float
    inference_ms: float
    total_ms: float
    prefill_ms: float
    decode_ms: float


class GenerateResponse(BaseModel):
    """POST /generate answer. `tokens` are the generated ids only (not the prompt's)."""

    text: str
    tokens: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length", "cancelled"]
    timing: Timing


class ErrorDetail(BaseModel):
    """`type` is the error class (invalid_request_error, timeout_error, server_error); `code` the exact case."""

    message: str
    type: str
    code: str


class ErrorResponse(BaseModel):
    """Every non-2xx answer has this body."""

    error: ErrorDetail


class HealthResponse(BaseModel):
    """GET /health. Answered on the event loop, so it stays fast while generations run."""

    status: Literal["ok"]
    max_concurrency: int
    in_flight: int  # generations holding a slot now
    waiting: int  # requests waiting for a slot
    max_seq_len: int
