"""Chat messages -> one prompt string: the model's chat template, or a simple built-in role format.

    chat_template.jinja, or "chat_template"    -> render it with Jinja2 in a sandbox, as
    in tokenizer_config.json                      Hugging Face's apply_chat_template does
                                                  (messages, add_generation_prompt,
                                                  bos_token, eos_token, raise_exception,
                                                  strftime_now, tojson, {% break %})
    otherwise                                  -> "system: ...\\nuser: ...\\nassistant:"

Tools (OpenAI's `tools`, assistant `tool_calls`, `tool` turns): a template that mentions `tools` renders them
itself, given what apply_chat_template(messages, tools=...) gives it, and asks for calls in its own format
(`tool_format`: chat_tools.HERMES or LLAMA3_JSON); any other template (and the built-in format) gets
chat_tools.fallback_messages, the documented plain-text format (HERMES).

A template that fails to render (bad template, or it rejects the conversation via
raise_exception) is the client's 400, with the template's message.

`chat_formatter` is the one way to build the formatter of a model directory (the server's
and fine-tuning's, so a model is trained on exactly the prompts it is served), and
`encode_chat` the one way to tokenize a rendered prompt: the special tokens the template
writes (<|im_start|>, ...) become the special tokens, as with Hugging Face's
apply_chat_template(tokenize=True); a plain completion prompt keeps them as text.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinystack.infer.chat_tools import HERMES, ToolCallFormat, fallback_messages, hf_messages, tool_call_format
from tinystack.model.io import load_chat_template


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered into a prompt; `param` is the request field to blame (the server's
    400 names it)."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})  # render's own


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatFormatter:
    def __init__(self, template: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.template_source = template
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = None
        if template is not None:
            # the environment transformers' apply_chat_template gives a template: {% break %} / {% continue %},
            # a tojson that keeps non-ASCII text and does not HTML-escape, strftime_now (Llama 3.1+ templates
            # write today's date with it, else a fixed one), raise_exception
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
            try:
                self._template = env.from_string(template)
            except TemplateError as e:  # a template that does not even parse: named when the model is loaded
                line = getattr(e, "lineno", None)
                raise ChatTemplateError(f"chat template does not parse{f' (line {line})' if line else ''}: "
                                        f"{' '.join(str(e).split())}") from None

    @property
    def supports_tools(self) -> bool:
        """The template has a tool section of its own (it reads `tools`): Hugging Face's test, on the text."""
        return self.template_source is not None and "tools" in self.template_source

    @property
    def reasoning(self) -> bool:
        """The template writes thinking blocks (<think>, Qwen3's and DeepSeek-R1's): answers are split into
        reasoning and content by the server."""
        return self.template_source is not None and "<think>" in self.template_source

    @property
    def tool_format(self) -> ToolCallFormat:
        """How the model is asked to write a tool call: its template's format, the fallback's (HERMES) otherwise."""
        return tool_call_format(self.template_source) if self.supports_tools else HERMES

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, continue_final_message: bool = False,
               template_kwargs: dict[str, Any] | None = None) -> str:
        """messages: [{"role", "content"}] (content already text; OpenAI's `tool_calls` / `tool_call_id` may be
        there too) -> the prompt to continue (or, with add_generation_prompt=False, the conversation as written:
        what fine-tuning trains on). `tools`: OpenAI tool dicts, or None. continue_final_message: the prompt ends
        inside the last message (the text after its content cut off, as apply_chat_template does), so the model
        continues it (an answer's prefill). template_kwargs: more variables for the template (e.g. Qwen3's
        enable_thinking); names it does not read are ignored, the names render sets itself are refused."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt exclude each other (set "
                                    "add_generation_prompt to false)", "continue_final_message")
        if clash := RESERVED.intersection(template_kwargs or {}):
            raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(sorted(clash))}",
                                    "chat_template_kwargs")
        text = self._render(messages, add_generation_prompt, tools, template_kwargs or {})
        if not continue_final_message:
            return text
        final = (messages[-1].get("content") or "").strip()
        at = text.rfind(final) if final else -1
        if at < 0:
            raise ChatTemplateError("continue_final_message: the chat template does not write the final message's "
                                    "content as given, so the prompt cannot end inside it")
        return text[:at + len(final)]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]) -> str:
        has_tool_turns = tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        extra: dict[str, Any] = dict(template_kwargs)
        if has_tool_turns and self.supports_tools:
            messages = hf_messages(messages)
            if tools:
                extra["tools"] = tools
        elif has_tool_turns:
            messages = fallback_messages(messages, tools)
        if self._template is None:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + "assistant:" if add_generation_prompt else text
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError) as e:
            raise ChatTemplateError(f"chat template failed: {e}") from None


def chat_formatter(model_dir: str | Path | None, tokenizer: Any) -> ChatFormatter:
    """The formatter of `model_dir`: its template, and its EOS text for templates that write it. Also readies
    `tokenizer` for encode_chat (its special-token encoder is a second copy of the vocabulary, built on first use):
    a formatter is made where chats will be encoded, so the build lands here, not in the first chat request."""
    eos_id = getattr(tokenizer, "eos_token_id", None)
    eos = tokenizer.decode([eos_id]) if eos_id is not None else ""
    encode_chat(tokenizer, "")
    return ChatFormatter(load_chat_template(model_dir), eos_token=eos)


def encode_chat(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a rendered chat prompt: template special-token text -> those tokens, where the
    tokenizer can (infer.tokenizer.Tokenizer); other tokenizers have no such tokens to write."""
    encode = getattr(tokenizer, "encode_with_special_tokens", None) or tokenizer.encode_ordinary
    return encode(prompt)
