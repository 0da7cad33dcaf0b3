"""FastAPI dependencies: the server's shared objects, and the request limits that depend on config.

`validated_request` is where a /generate request is fully checked, in this order,
before it can wait for a concurrency slot:

    body parses as GenerateRequest (FastAPI + pydantic)      -> 400 malformed JSON / 422 per field
    len(prompt) <= cfg.max_prompt_chars                      -> 413 (checked before tokenizing)
    max_tokens <= cfg.max_tokens_limit                       -> 422 (an omitted max_tokens is
                                                                clamped to the limit instead)
    prompt fits the model's context (engine.encode_prompt)   -> 400
    SamplingParams(...) accepts the values                   -> 422

It is a plain `def`, so FastAPI runs it in its thread pool: tokenizing a long prompt
never blocks the event loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from tinystack.config import ServeConfig
from tinystack.infer.engine import PromptTooLongError
from tinystack.infer.sampler import SamplingParams
from tinystack.serve.context import RequestContext, request_context
from tinystack.serve.errors import SERVER_ERROR, ApiError
from tinystack.serve.runner import InferenceRunner
from tinystack.serve.schemas import GenerateRequest


@dataclass(frozen=True)
class ValidatedRequest:
    """A /generate request that passed every check: ready to run."""

    body: GenerateRequest
    params: SamplingParams
    prompt_tokens: int


async def get_serve_config(request: Request) -> ServeConfig:
    """The ServeConfig given to create_app."""
    return request.app.state.serve_config


async def get_engine(request: Request) -> Any:
    """The Engine given to create_app."""
    return request.app.state.engine


async def get_runner(request: Request) -> InferenceRunner:
    """The running server's InferenceRunner (created by the app's lifespan); 503 outside it."""
    runner = getattr(request.app.state, "runner", None)
    if runner is None:
        raise ApiError(503, "server is not running (starting up or shutting down)", "not_running", SERVER_ERROR)
    return runner


ServeCfg = Annotated[ServeConfig, Depends(get_serve_config)]
EngineDep = Annotated[Any, Depends(get_engine)]
Runner = Annotated[InferenceRunner, Depends(get_runner)]
Context = Annotated[RequestContext, Depends(request_context)]


def validated_request(body: GenerateRequest, cfg: ServeCfg, engine: EngineDep, ctx: Context) -> ValidatedRequest:
    """Apply the config-dependent limits to a parsed body; raise ApiError with the numbers on failure."""
    if len(body.prompt) > cfg.max_prompt_chars:
        raise ApiError(413, f"prompt is {len(body.prompt)} characters; the limit is {cfg.max_prompt_chars}",
                       "prompt_too_many_chars")
    max_tokens = body.max_tokens
    if "max_tokens" not in body.model_fields_set:  # the default never exceeds the server's limit
        max_tokens = min(max_tokens, cfg.max_tokens_limit)
    elif max_tokens > cfg.max_tokens_limit:
        raise ApiError(422, f"max_tokens: must be at most {cfg.max_tokens_limit}, got {max_tokens}",
                       "validation_error")
    try:
        prompt_tokens = len(engine.encode_prompt(body.prompt))
    except PromptTooLongError as e:
        raise ApiError(400, str(e), "prompt_too_many_tokens") from None
    ctx.fields["prompt_tokens"] = prompt_tokens
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_k=body.top_k,
                                top_p=body.top_p, seed=body.seed)
    except ValueError as e:
        raise ApiError(422, str(e), "validation_error") from None
    return ValidatedRequest(body, params, prompt_tokens)


Validated = Annotated[ValidatedRequest, Depends(validated_request)]
