"""The HTTP routes. Each one wires dependencies to service.py / openai_service.py and nothing more.

    POST /generate               native endpoint (the foundation's; kept)
    POST /v1/completions         OpenAI completions, whole or streamed (SSE)
    POST /v1/chat/completions    OpenAI chat completions, whole or streamed (SSE)
    GET  /v1/models              the model served, and its LoRA adapters (with their parent)
    POST /v1/load_lora_adapter  /v1/unload_lora_adapter   LoRA adapters at run time (admin keys; lora_admin.py)
    POST /v1/embeddings          OpenAI embeddings: the model's hidden states pooled (embeddings.py)
    POST /tokenize  /detokenize  the ids a prompt or chat runs as, and back (vLLM's; tokenize.py)
    GET  /health  /ready            open unless cfg.open_health is false
    GET  /metrics                   Prometheus text format (tinystack.observe.metrics); open likewise
    GET  /metrics.json              the counters and settings as JSON (the serving layer's own view)

No route here checks the API key: the app's root router does, for every route (deps.authenticate); the open
ones are listed there (deps.OPEN_ROUTES, deps.PROBE_ROUTES). A route that needs the caller's id (rate limits)
asks for `Caller`.
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tinystack.observe.metrics import CONTENT_TYPE
from tinystack.serve.api import embeddings, lora_admin, openai_service, service, tokenize
from tinystack.serve.api.deps import Caller, Context, State, Validated, require_admin
from tinystack.serve.api.errors import ApiError
from tinystack.serve.api.exact_json import ExactJsonRoute
from tinystack.serve.api.openai_schemas import ChatCompletionRequest, CompletionRequest
from tinystack.serve.api.requests import Prepared, prepare_chat, prepare_completion, prepare_off_loop
from tinystack.serve.api.schemas import ErrorResponse, GenerateResponse, HealthResponse
from tinystack.serve.engine.disconnect import ClientDisconnected, unless_disconnected
from tinystack.serve.engine.execution import check_rate, embed

router = APIRouter(route_class=ExactJsonRoute)  # bodies' numbers read as JSON Schema reads them

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse}
                                            for code in (400, 401, 413, 422, 429, 500, 503, 504)}
_SSE_EVENT = {"type": "object", "description": "One server-sent event (the schema of each event, not of the "
                                              "whole body).", "required": ["data"],
              "properties": {"data": {"type": "string", "description": "A chunk as JSON (a completion or "
                                                                       "chat.completion.chunk object, or "
                                                                       "{\"error\": ...}), or [DONE]."}}}
# A completion answers JSON, or with `stream: true` server-sent events: say both in /openapi.json
_STREAMED = {**_ERRORS, 200: {"description": "The whole answer (JSON), or with `stream: true` server-sent events: "
                                             "`data: {chunk}` lines, then `data: [DONE]`; an error after the "
                                             "first chunk is a `data: {\"error\": ...}` event before [DONE].",
                              "content": {"application/json": {"schema": {"type": "object"}},
                                          "text/event-stream": {"schema": _SSE_EVENT}}}}


def _closed_response(status: int = 499) -> JSONResponse:
    return JSONResponse({"error": {"message": "client disconnected", "type": "client_closed", "param": None,
                                   "code": "client_disconnected"}}, status_code=status)


@router.post("/generate", response_model=GenerateResponse, responses=_ERRORS)
async def generate(request: Request, req: Validated, state: State, ctx: Context, who: Caller) -> Any:
    """Continue `prompt` with up to `max_tokens` new tokens; the answer carries timing in ms."""
    check_rate(state, who, req.tokens_asked)
    try:
        return await unless_disconnected(request, service.generate(state, req, ctx))
    except ClientDisconnected:
        state.count("aborted")
        return _closed_response()


async def _openai(request: Request, state: State, ctx: Context, who: str, kind: openai_service.Kind,
                  prep: Prepared) -> Any:
    ctx.fields.update(prompt_tokens=prep.prompt_tokens, n=prep.n, stream=prep.stream)
    ctx.model = prep.lora  # the log line and the metrics name the adapter that answered
    ctx.timing.mark_clamped("validated")
    check_rate(state, who, prep.tokens_asked)
    if not prep.stream:
        try:
            body = await unless_disconnected(request, openai_service.complete(state, kind, prep, ctx))
        except ClientDisconnected:
            state.count("aborted")
            return _closed_response()
        ctx.fields.update(completion_tokens=body["usage"]["completion_tokens"], degraded=body.get("degraded", False))
        return JSONResponse(body)  # already JSON-ready: skip FastAPI's jsonable_encoder pass
    events = openai_service.stream(state, kind, prep, ctx)
    try:
        first = await unless_disconnected(request, events.__anext__())  # errors before the 1st token: real status
    except (ApiError, ClientDisconnected, StopAsyncIteration) as e:
        await events.aclose()
        if isinstance(e, ClientDisconnected):
            state.count("aborted")
            return _closed_response()
        raise

    ttft = ctx.timing.seconds("ttft_ms")
    if ttft is None:  # the engine's stamp comes at the end; the first token is here now
        ttft = time.perf_counter() - ctx.timing.points["arrival"]

    async def body() -> AsyncIterator[bytes]:
        complete = False
        try:
            yield first
            async for chunk in events:
                yield chunk
            complete = True
        finally:  # also on client disconnect (Starlette cancels us): aborts the sequences
            if not complete:  # cut short: the client went away (errors are sent as events, then [DONE])
                ctx.failure = ctx.failure or "aborted"
                state.count("aborted")
            await events.aclose()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      "x-time-to-first-token": f"{ttft:.6f}"})


@router.post("/v1/completions", responses=_STREAMED)
async def completions(request: Request, body: CompletionRequest, state: State, ctx: Context, who: Caller) -> Any:
    """OpenAI completions; `stream: true` answers with server-sent events ending in `data: [DONE]`."""
    chars = len(body.prompt) if isinstance(body.prompt, str) else sum(len(p) if isinstance(p, str) else 4
                                                                      for p in body.prompt)
    prep = await prepare_off_loop(prepare_completion, state, body, chars)
    return await _openai(request, state, ctx, who, "text", prep)


@router.post("/v1/chat/completions", responses=_STREAMED)
async def chat_completions(request: Request, body: ChatCompletionRequest, state: State, ctx: Context,
                           who: Caller) -> Any:
    """OpenAI chat completions (the model's chat template, or a plain `role: content` format)."""
    chars = sum(len(m.content) if isinstance(m.content, str) else 1000 for m in body.messages)
    prep = await prepare_off_loop(prepare_chat, state, body, chars)
    return await _openai(request, state, ctx, who, "chat", prep)


@router.post("/v1/embeddings", responses=_ERRORS)
async def create_embeddings(body: embeddings.EmbeddingRequest, state: State, who: Caller) -> dict[str, Any]:
    """OpenAI embeddings: one vector per input, the model's hidden states pooled ([serve] embedding_pooling)."""
    chars = sum(len(x) if isinstance(x, str) else 4 for x in embeddings.inputs_of(body))
    ids = await prepare_off_loop(embeddings.encode_inputs, state, body, chars)
    check_rate(state, who, sum(len(x) for x in ids))
    return embeddings.response(state, body, ids, await embed(state, ids))


@router.post("/tokenize", response_model=tokenize.TokenizeResponse, responses=_ERRORS)
async def tokenize_prompt(body: tokenize.TokenizeRequest, state: State) -> Any:
    """The token ids /v1/completions (`prompt`) or /v1/chat/completions (`messages`) would run."""
    chars = len(body.prompt or "") + sum(len(m.content) if isinstance(m.content, str) else 1000
                                         for m in body.messages or [])
    return await prepare_off_loop(tokenize.tokenize, state, body, chars)


@router.post("/detokenize", response_model=tokenize.DetokenizeResponse, responses=_ERRORS)
async def detokenize_ids(body: tokenize.DetokenizeRequest, state: State) -> Any:
    """The text of token ids."""
    return await prepare_off_loop(tokenize.detokenize, state, body, len(body.tokens))


@router.post("/v1/load_lora_adapter", dependencies=[Depends(require_admin)], responses={**_ERRORS, 403: _ERRORS[401]})
async def load_lora_adapter(body: lora_admin.LoadLoRARequest, state: State) -> dict[str, str]:
    """Load a PEFT LoRA adapter under a name requests can give as `model` (admin key)."""
    return await lora_admin.load(state, body)


@router.post("/v1/unload_lora_adapter", dependencies=[Depends(require_admin)],
             responses={**_ERRORS, 403: _ERRORS[401], 404: _ERRORS[401], 409: _ERRORS[401]})
async def unload_lora_adapter(body: lora_admin.UnloadLoRARequest, state: State) -> dict[str, str]:
    """Unload an adapter; 409 while requests run with it (admin key)."""
    return await lora_admin.unload(state, body)


@router.get("/v1/models", responses=_ERRORS)
async def models(state: State) -> dict[str, Any]:
    """The model this server serves."""
    return service.models(state)


@router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def health(state: State) -> Any:
    """Is the engine loop alive and stepping (503 if not), and the load; never waits for a generation."""
    body, status = service.health(state)
    return JSONResponse(body.model_dump(), status_code=status)


@router.get("/ready")
async def ready(state: State) -> Any:
    """200 when the model is loaded and the server is not draining; 503 otherwise."""
    body, status = service.ready(state)
    return JSONResponse(body, status_code=status)


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, state: State) -> Response:
    """Prometheus metrics (text exposition format): latency histograms, tokens, failures, cost per key,
    engine gauges, GC pauses and event-loop lag (see tinystack.observe.metrics)."""
    return Response(request.app.state.observer.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/metrics.json")
async def metrics_json(state: State) -> dict[str, Any]:
    """Counters since start (degraded answers, engine failures, 429s, timeouts, aborts), the engine's
    sequences ended by finish reason, and the settings."""
    s = state.adapter.stats()
    return {"counters": dict(state.counters), "breaker": state.breaker.state, "in_flight": state.gate.in_flight,
            "running": s.running, "waiting": s.waiting, "kv_bytes_in_use": s.kv_bytes_in_use,
            "sequences_ended": s.ended, "settings": state.settings()}
