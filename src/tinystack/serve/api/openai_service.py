"""OpenAI response shapes: completions and chat completions, whole or as server-sent events.

    Prepared --execution.run--> Delta / Fallback
        whole:   collect every choice -> {"id", "object", "created", "model", "choices", "usage"}
        stream:  one `data: {chunk}` per delta; finish_reason on each choice's last chunk;
                 with stream_options.include_usage every chunk has "usage": null and a last
                 chunk with "choices": [] carries the usage; then `data: [DONE]`
    timing:  the final chunk before [DONE] (the usage chunk, else the last choice's last chunk)
             carries an extension field "timing": {"queue_ms", "prefill_ms", "decode_ms",
             "ttft_ms", "tpot_ms", "total_ms", ...} (tracking.timing_body; clients ignore it).
             Whole answers carry the same numbers in the x-*-time headers (middleware.py).

Tools (prep.tools, a chat request's tools unless tool_choice is "none") and thinking (a template that writes
<think>): each choice's text goes through an answer.ChatAnswer; whole, the message has `reasoning_content`,
`tool_calls` and `content` null when there is no other text; streamed, `delta.reasoning_content`,
`delta.tool_calls` entries (index, id, type and name once, then `function.arguments` pieces) and only the rest
as `delta.content`. An answer that ended with calls has finish_reason "tool_calls".

A degraded answer (the engine failed, cfg.fallback_text set) has the normal shape
plus `"degraded": true`. An error after a stream has started (it can no longer
change the status code) is sent as `data: {"error": {...}}` followed by `data: [DONE]`.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal

from tinystack.observe.logs import json_line
from tinystack.observe.usage import RequestUsage
from tinystack.serve.api.answer import ChatAnswer
from tinystack.serve.api.context import RequestContext
from tinystack.serve.api.errors import ApiError
from tinystack.serve.api.requests import Prepared
from tinystack.serve.engine.adapter import TokenEvent
from tinystack.serve.engine.execution import Fallback, prompt_events, run
from tinystack.serve.engine.generation import Delta
from tinystack.serve.engine.tracking import RequestTracker, timing_body
from tinystack.serve.state import ServerState

Kind = Literal["text", "chat"]


@dataclass
class _Choice:
    text: str = ""
    tokens: list[TokenEvent] = field(default_factory=list)
    finish_reason: str | None = None


def _logprobs(state: ServerState, kind: Kind, tokens: list[TokenEvent], offset: int = 0) -> dict[str, Any]:
    text = state.adapter.token_text
    if kind == "chat":
        def entry(tid: int, lp: float) -> dict[str, Any]:
            t = text(tid)
            return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
        return {"content": [{**entry(ev.token_id, ev.logprob or 0.0),
                             "top_logprobs": [entry(t, lp) for t, lp in ev.top_logprobs]} for ev in tokens]}
    offsets, pos = [], offset
    for ev in tokens:
        offsets.append(pos)
        pos += len(text(ev.token_id))
    return {"tokens": [text(ev.token_id) for ev in tokens], "token_logprobs": [ev.logprob for ev in tokens],
            "top_logprobs": [{text(t): lp for t, lp in ev.top_logprobs} if ev.logprob is not None else None
                             for ev in tokens], "text_offset": offsets}


def _choice(state: ServerState, kind: Kind, prep: Prepared, index: int, text: str, tokens: list[TokenEvent],
            finish: str | None, stream: bool, offset: int = 0, parsed: dict[str, Any] | None = None) -> dict[str, Any]:
    """One choice; `parsed`: the ChatAnswer's message (whole) or delta (streamed), in place of `text`'s."""
    logprobs = _logprobs(state, kind, tokens, offset) if prep.params.logprobs is not None and tokens else None
    out: dict[str, Any] = {"index": index}
    if kind == "text":
        out["text"] = text
    elif stream:
        out["delta"] = parsed if parsed is not None else {"content": text} if text else {}
    else:
        out["message"] = parsed or {"role": "assistant", "content": text}
    out.update(logprobs=logprobs, finish_reason=finish)
    return out


def _usage(prep: Prepared, completion_tokens: int, usage: RequestUsage) -> dict[str, Any]:
    """OpenAI's usage; prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache served (every
    sequence reports before its last tokens reach us, so `usage` is complete here)."""
    prompt = prep.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


async def _echo(state: ServerState, prep: Prepared, ids: list[int]) -> tuple[str, list[TokenEvent]]:
    """A prompt as an echoed answer starts: its text, and its tokens (scored when logprobs are asked for)."""
    return state.adapter.decode(ids), await prompt_events(state, ids, prep.params.logprobs, prep.lora)


def _envelope(state: ServerState, kind: Kind, rid: str, created: int, stream: bool,
              prep: Prepared) -> dict[str, Any]:
    obj = "text_completion" if kind == "text" else ("chat.completion.chunk" if stream else "chat.completion")
    return {"id": rid, "object": obj, "created": created, "model": prep.lora or state.model_name,
            "system_fingerprint": None}


def new_id(kind: Kind) -> str:
    return ("cmpl-" if kind == "text" else "chatcmpl-") + uuid.uuid4().hex


async def complete(state: ServerState, kind: Kind, prep: Prepared, ctx: RequestContext) -> dict[str, Any]:
    """The whole answer (non-streaming)."""
    choices = [_Choice() for _ in range(prep.choices)]
    degraded = False
    tracker = RequestTracker(ctx)
    tracker.enqueued()
    try:
        async for item in run(state, prep, tracker.usage):
            tracker.see(item)
            if isinstance(item, Fallback):
                choices = [_Choice(item.text, [], "stop") for _ in range(prep.choices)]
                degraded = True
                break
            c = choices[item.index]
            c.text += item.text
            c.tokens.extend(item.tokens)
            c.finish_reason = item.finish_reason or c.finish_reason
    finally:
        tracker.done()
    parsed: list[dict[str, Any] | None] = [None] * prep.choices
    if kind == "chat" and prep.parses_answer and not degraded:
        for i, c in enumerate(choices):
            answer = ChatAnswer(prep.reasoning_opened, prep.tools)
            answer.feed(c.text, final=True)
            parsed[i], c.finish_reason = answer.message(), answer.finish_reason(c.finish_reason)
    ctx.finish_reasons = [c.finish_reason or "stop" for c in choices]
    out = _envelope(state, kind, new_id(kind), int(time.time()), stream=False, prep=prep)
    out["usage"] = _usage(prep, sum(len(c.tokens) for c in choices), tracker.usage)
    if prep.echo and not degraded:  # each answer starts with its prompt (and its scored tokens)
        echoed = [await _echo(state, prep, ids) for ids in prep.prompts]
        for i, c in enumerate(choices):
            text, events = echoed[i // prep.n]
            c.text, c.tokens = text + c.text, events + c.tokens
    out["choices"] = [_choice(state, kind, prep, i, c.text, c.tokens, c.finish_reason, False, parsed=parsed[i])
                      for i, c in enumerate(choices)]
    if degraded:
        out["degraded"] = True
    return out


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <JSON>` on a single line for any line splitter, then a blank line."""
    text = data if isinstance(data, str) else json_line(data)  # U+2028 etc. escaped: one line for any splitter
    return f"data: {text}\n\n".encode()


def _final_timing(state: ServerState, ctx: RequestContext, tracker: RequestTracker) -> dict[str, Any]:
    """The answer is complete: mark the engine's points and `returned`, and give the timing object."""
    tracker.done()
    ctx.mark_returned()
    return timing_body(ctx, state.cfg.price_per_device_hour)


async def stream(state: ServerState, kind: Kind, prep: Prepared, ctx: RequestContext) -> AsyncIterator[bytes]:
    """Server-sent events. The first item is produced before any byte is sent (the route awaits it),
    so failures before the first token still get their real status code."""
    rid, created = new_id(kind), int(time.time())
    completion_tokens = 0
    offsets = [0] * prep.choices
    sent_any = False
    finished = 0
    tracker = RequestTracker(ctx)
    tracker.enqueued()
    answers = [ChatAnswer(prep.reasoning_opened, prep.tools) for _ in range(prep.choices)] \
        if kind == "chat" and prep.parses_answer else []

    def chunk(choices: list[dict[str, Any]], degraded: bool = False, timing: dict | None = None) -> bytes:
        body = {**_envelope(state, kind, rid, created, stream=True, prep=prep), "choices": choices}
        if prep.include_usage:
            body["usage"] = None
        if degraded:
            body["degraded"] = True
        if timing is not None:
            body["timing"] = timing
        return sse(body)

    echoed = [await _echo(state, prep, ids) for ids in prep.prompts] if prep.echo else []
    echo_sent = [False] * prep.choices
    items = run(state, prep, tracker.usage)
    try:
        async for item in items:
            tracker.see(item)
            if isinstance(item, Fallback):
                if sent_any:
                    raise ApiError(503, "the model failed while streaming; the answer is incomplete",
                                   "engine_unavailable", "server_error")
                ctx.finish_reasons = ["stop"] * prep.choices
                for i in range(prep.choices):
                    first = {"delta": {"role": "assistant"}} if kind == "chat" else {}
                    last = i == prep.choices - 1 and not prep.include_usage
                    yield chunk([{**_choice(state, kind, prep, i, item.text, [], "stop", True), **first}], True,
                                _final_timing(state, ctx, tracker) if last else None)
                break
            assert isinstance(item, Delta)
            if kind == "chat" and not sent_any:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(prep.choices)])
            sent_any = True
            completion_tokens += len(item.tokens)
            finish, parsed, text, tokens = item.finish_reason, None, item.text, item.tokens
            if echoed and not echo_sent[item.index]:  # a choice's first chunk starts with its prompt
                echo_sent[item.index] = True
                prompt_text, prompt_tokens = echoed[item.index // prep.n]
                text, tokens = prompt_text + text, prompt_tokens + tokens
            if answers:  # thinking as reasoning_content, calls as tool_calls deltas, only the rest as content
                answer = answers[item.index]
                parsed = answer.feed(item.text, final=finish is not None)
                finish = answer.finish_reason(finish)
            if finish is not None:
                finished += 1
                ctx.finish_reasons.append(finish)
            last = finished == prep.choices and not prep.include_usage
            yield chunk([_choice(state, kind, prep, item.index, text, tokens, finish, True, offsets[item.index],
                                 parsed)], timing=_final_timing(state, ctx, tracker) if last else None)
            offsets[item.index] += len(text)
        if prep.include_usage:
            yield sse({**_envelope(state, kind, rid, created, stream=True, prep=prep), "choices": [],
                       "usage": _usage(prep, completion_tokens, tracker.usage),
                       "timing": _final_timing(state, ctx, tracker)})
    except ApiError as e:
        if not sent_any:
            raise
        ctx.failure = e.failure or {504: "timeout", 429: "overloaded"}.get(e.status, "engine_error")
        ctx.fields["error_code"] = e.code
        yield sse(e.body())
    finally:
        await items.aclose()
    yield sse("[DONE]")
