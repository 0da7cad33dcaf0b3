"""Parsed request bodies -> `Prepared`: prompt ids and SamplingParams that passed every check.

Checks, in order (each an ApiError with the numbers in the message):

    (the body's size was checked first: max_body_bytes -> 413; a prompt is limited in tokens, below)
    n > max_n                                                -> 400
    max_tokens > max_tokens_limit                            -> 400
    the engine's prompt rules (infer.LLMEngine.encode_prompt) -> 400 with its message; a prompt
                                                                that fills the context is
                                                                "context_length_exceeded"
    prompt tokens + max_tokens > max_seq_len                 -> 400 "prompt is P tokens and max_tokens
                                                                is M: P + M exceeds the context of C
                                                                tokens (at most C - M prompt tokens)"
    SamplingParams rejects a value                           -> 400
    tools / tool_choice / response_format / structured_outputs that make no sense together,
    or a constraint the grammar engine cannot compile        -> 400 naming the field (tools.py,
                                                                structured.py)

An omitted max_tokens is min(default_max_tokens, max_tokens_limit, context left); an omitted sampling
parameter that a model may set (SamplingParams' `model_default` ones: temperature, top_p, top_k, min_p,
repetition_penalty) is the model's own (its generation_config.json, when it sets one and [serve]
model_sampling_defaults is on), else the table's default.
A temperature below 1e-5 is greedy (as in vLLM): dividing logits by it would overflow;
a top_p below 1e-6 is 1e-6 (float32 would round it to 0 and drop every token).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from tinystack.infer.chat import ChatTemplateError, encode_chat, message_text
from tinystack.infer.llm_engine import PromptError, PromptTooLongError
from tinystack.sampling_params import KNOBS, SamplingParams
from tinystack.serve.api.errors import (
    CHAT_TEMPLATE_ERROR,
    CONFLICTING_FIELDS,
    CONTEXT_LENGTH_EXCEEDED,
    TOO_MANY_SEQUENCES,
    ApiError,
)
from tinystack.serve.api.openai_schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from tinystack.serve.api.reasoning import prompt_opens_thinking
from tinystack.serve.api.structured import check_constraint, constraint_of
from tinystack.serve.api.tools import ToolPlan, plan_tools
from tinystack.serve.engine.deadline import request_timeout_s
from tinystack.serve.state import ServerState

GREEDY_BELOW = 1e-5
MIN_TOP_P = 1e-6


@dataclass
class Prepared:
    prompt: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    stops: tuple[str, ...]
    timeout_s: float
    stream: bool = False
    include_usage: bool = False
    tools: ToolPlan | None = None  # a chat request's tools: its answer's calls are parsed unless tool_choice none
    reasoning_opened: bool | None = None  # a thinking template's chat: did the prompt open the block (reasoning.py)
    batch: list[list[int]] = field(default_factory=list)  # a completion of several prompts: each one's ids
    echo: bool = False  # completions: the answer starts with its prompt (and the prompt's logprobs)
    lora: str | None = None  # the LoRA adapter the body's `model` names (None: the base model)

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt's ids: choice c answers prompts[c // n] (OpenAI's order)."""
        return self.batch or [self.prompt_ids]

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def tokens_asked(self) -> int:
        """What the rate limiter counts: the prompts, and max_tokens for each choice."""
        return self.prompt_tokens + self.params.max_tokens * self.choices

    @property
    def parses_answer(self) -> bool:
        """A chat answer that is more than content: tool calls or thinking are split off it (answer.py)."""
        return self.tools is not None or self.reasoning_opened is not None


def _param(name: str, message: str, status: int = 400, code: str = "invalid_value") -> ApiError:
    return ApiError(status, message, code, param=name)


def lora_of(state: ServerState, model: str | None) -> str | None:
    """The LoRA adapter a body's `model` names, None for the base. A server without adapters answers any `model`
    with its one model (as before); one with adapters takes the base's name or an adapter's, else a 404."""
    names = state.adapter.lora_names()
    if model is not None and model in names:
        return model
    if names and model is not None and model != state.model_name:
        served = ", ".join([state.model_name, *names])
        raise ApiError(404, f"the model {model!r} does not exist here (served: {served})", "model_not_found",
                       param="model")
    return None


def template_error(e: ChatTemplateError) -> ApiError:
    """A 400 naming the field: chat_template_error when the model's template refused the messages (no schema can
    say which it takes), invalid_value when a rule of the request's own fields was broken."""
    return _param(e.param, str(e), code=CHAT_TEMPLATE_ERROR if e.param == "messages" else "invalid_value")


def check_token_ids(state: ServerState, ids: list[int], param: str) -> None:
    """Every id in this model's vocabulary, else a 400 naming the first that is not."""
    vocab = state.adapter.tokenizer.vocab_size
    if (bad := next((t for t in ids if not 0 <= t < vocab), None)) is not None:
        raise _param(param, f"token {bad} is not in this model's vocabulary (0 to {vocab - 1})")


def prepare(state: ServerState, prompt: str, *, max_tokens: int | None, n: int = 1, stop: Any = None,
            timeout: float | None = None, prompt_ids: list[int] | None = None, **sampling: Any) -> Prepared:
    """Apply the config-dependent limits; `sampling` are SamplingParams fields; `prompt_ids`: the
    prompt already tokenized (a chat prompt, see infer.chat.encode_chat)."""
    cfg, adapter = state.cfg, state.adapter
    if n > cfg.max_n:
        raise _param("n", f"n must be at most {cfg.max_n}, got {n}")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())  # up to 4 non-empty: the schema's rule
    if max_tokens is not None and max_tokens > cfg.max_tokens_limit:
        raise _param("max_tokens", f"max_tokens must be at most {cfg.max_tokens_limit}, got {max_tokens}")
    try:  # a chat prompt comes tokenised (its template's special tokens parsed): the same rules apply
        ids = adapter.encode(prompt_ids if prompt_ids is not None else prompt)
    except PromptError as e:
        raise _param("prompt", str(e), code=CONTEXT_LENGTH_EXCEEDED if isinstance(e, PromptTooLongError)
                     else "invalid_value") from None
    ctx = adapter.max_seq_len
    if max_tokens is None:
        max_tokens = min(cfg.default_max_tokens, cfg.max_tokens_limit, ctx - len(ids))
    elif len(ids) + max_tokens > ctx:
        raise _param("max_tokens", f"prompt is {len(ids)} tokens and max_tokens is {max_tokens}: "
                                   f"{len(ids)} + {max_tokens} = {len(ids) + max_tokens} exceeds the model's context "
                                   f"of {ctx} tokens (max_seq_len - max_tokens = {ctx - max_tokens} prompt tokens "
                                   f"at most)", code=CONTEXT_LENGTH_EXCEEDED)
    if sampling.get("min_tokens", 0) > max_tokens:
        raise _param("min_tokens", f"min_tokens must be at most max_tokens ({max_tokens}), "
                                   f"got {sampling['min_tokens']}", code=CONFLICTING_FIELDS)
    if sampling.get("min_tokens", 0) and sampling.get("structured_outputs") is not None:
        raise _param("min_tokens", "min_tokens cannot be combined with a structured output constraint (the "
                                   "constraint decides where the answer ends)", code=CONFLICTING_FIELDS)
    if 0 < sampling.get("temperature", 1.0) < GREEDY_BELOW:  # logits / 1e-300 overflow to inf -> NaN probs
        sampling["temperature"] = 0.0
    if "top_p" in sampling:  # a top_p that float32 rounds to 0 would drop every token
        sampling["top_p"] = max(sampling["top_p"], MIN_TOP_P)
    try:
        params = SamplingParams(max_tokens=max_tokens, stop=stops, **sampling)
    except ValueError as e:
        raise ApiError(400, str(e), "invalid_value") from None
    timeout_s = request_timeout_s(cfg.timeout_s, cfg.max_tokens_limit, adapter.stats(), len(ids), max_tokens, timeout)
    return Prepared(prompt, ids, params, n, stops, timeout_s)


_OWN = ("max_tokens", "logprobs")  # sampling parameters a body spells its own way (see body_sampling)


def body_sampling(state: ServerState, body: Any) -> dict[str, Any]:
    """The body's sampling parameters (every field of SamplingParams' table but max_tokens and logprobs:
    prepare's and each endpoint's own), each one it omitted taken from the model's defaults
    (state.sampling_defaults: its generation_config.json), as vLLM does."""
    return {k: state.sampling_defaults[k] if k in state.sampling_defaults and k not in body.model_fields_set
            else getattr(body, k) for k in KNOBS if k not in _OWN}


def _logit_bias(state: ServerState, bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"50256": -100}) as SamplingParams takes it; a key that is not a token id of this
    model's vocabulary is a 400 naming it (a bias outside [-100, 100] was refused with the body)."""
    out = []
    vocab = state.adapter.tokenizer.vocab_size
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab:
            raise _param("logit_bias", f"logit_bias key {key[:20]!r} is not a token id of this model's vocabulary "
                                       f"(0 to {vocab - 1})")
        out.append((int(key), float(value)))
    return tuple(out)


def _common(state: ServerState, body: CompletionRequest | ChatCompletionRequest) -> dict[str, Any]:
    check_token_ids(state, body.stop_token_ids or [], "stop_token_ids")
    return dict(n=body.n, stop=body.stop, timeout=body.timeout, **body_sampling(state, body),
                logit_bias=_logit_bias(state, body.logit_bias), ignore_eos=body.ignore_eos,
                stop_token_ids=tuple(body.stop_token_ids or ()), priority=body.priority)


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Request messages as infer.chat renders them: content as text, and an assistant's calls and a tool turn's
    call id when there are."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": message_text(m.content)}
        if m.tool_calls:
            msg["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _streaming(prep: Prepared, body: CompletionRequest | ChatCompletionRequest) -> Prepared:
    prep.stream = body.stream
    prep.include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream_options is not None and not body.stream:
        raise _param("stream_options", "stream_options is only allowed with stream: true")
    return prep


def _completion_prompts(body: CompletionRequest) -> list[str | list[int]]:
    p = body.prompt
    if isinstance(p, str) or (p and isinstance(p[0], int)):
        return [p]
    return list(p)


def prepare_completion(state: ServerState, body: CompletionRequest) -> Prepared:
    """One Prepared for every prompt of the body (a batch runs as one request: prompt i's choices are i*n..)."""
    preps = []
    so, param = constraint_of(body)
    common = _common(state, body)  # the body's own checks (stop ids, logit_bias) once, not per prompt
    for prompt in _completion_prompts(body):
        ids = None
        if isinstance(prompt, list):  # token ids: run as given (the text is for the log and the character limit)
            ids = list(prompt)
            check_token_ids(state, ids, "prompt")
            prompt = state.adapter.tokenizer.decode(ids)
        preps.append(prepare(state, prompt, max_tokens=body.max_tokens, logprobs=body.logprobs, prompt_ids=ids,
                             structured_outputs=so, **common))
    prep = preps[0]
    if len(preps) > 1:
        if any(p.params.max_tokens != prep.params.max_tokens for p in preps):  # defaulted to what fits each
            prep.params = replace(prep.params, max_tokens=min(p.params.max_tokens for p in preps))
        prep.batch = [p.prompt_ids for p in preps]
        prep.prompt = "".join(p.prompt for p in preps)  # the log's and the character limit's
        if prep.choices > state.gate.capacity:  # it could never be admitted: not a 429 to retry
            raise _param("prompt", f"{len(preps)} prompts x n = {prep.choices} sequences; this server runs or "
                                   f"queues at most {state.gate.capacity}", code=TOO_MANY_SEQUENCES)
    prep.echo, prep.lora = body.echo, lora_of(state, body.model)
    check_constraint(state, prep.params, param or "structured_outputs")
    return _streaming(prep, body)


def prepare_chat(state: ServerState, body: ChatCompletionRequest) -> Prepared:
    if body.top_logprobs is not None and not body.logprobs:
        raise _param("top_logprobs", "top_logprobs needs logprobs: true")
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, body.response_format,
                      state.chat.tool_format)
    so, param = constraint_of(body)
    if plan is not None and plan.constraint is not None:  # plan_tools refused a response_format beside it
        so, param = plan.constraint, "tools"
    try:  # tool_choice "none": the model is not told about the tools (nothing would parse its calls)
        prompt = state.chat.render(chat_messages(body.messages), tools=plan.tools if plan and plan.parse else None,
                                   add_generation_prompt=body.add_generation_prompt,
                                   continue_final_message=body.continue_final_message,
                                   template_kwargs=body.chat_template_kwargs)
    except ChatTemplateError as e:
        raise template_error(e) from None
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    prep = prepare(state, prompt, max_tokens=body.max_tokens if body.max_completion_tokens is None
                   else body.max_completion_tokens, logprobs=logprobs,
                   prompt_ids=encode_chat(state.adapter.tokenizer, prompt), structured_outputs=so,
                   **_common(state, body))
    check_constraint(state, prep.params, param or "structured_outputs")
    prep.tools = plan if plan is not None and plan.parse else None
    prep.lora = lora_of(state, body.model)
    prep.reasoning_opened = prompt_opens_thinking(prompt) if state.chat.reasoning else None
    return _streaming(prep, body)


INLINE_CHARS = 2_000  # shorter prompts tokenize in well under a millisecond: no thread hop


def _constrained(body: Any) -> bool:
    """The body asks for a constraint, which prepare_* compiles (up to [infer] structured_compile_timeout_s)."""
    rf = getattr(body, "response_format", None)
    return (getattr(body, "structured_outputs", None) is not None or (rf is not None and rf.type != "text")
            or (bool(getattr(body, "tools", None)) and getattr(body, "tool_choice", None) != "none"))


async def prepare_off_loop(fn: Any, state: ServerState, body: Any, prompt_chars: int) -> Any:
    """Run fn(state, body) (a prepare_*, or /tokenize's) on the event loop for a short prompt, in a thread for a
    long one (tokenizing a long prompt must not block the loop; a thread hop costs more than a short one) or a
    constrained one (compiling a grammar can take up to its time limit)."""
    if prompt_chars <= INLINE_CHARS and not _constrained(body):
        return fn(state, body)
    return await asyncio.to_thread(fn, state, body)
