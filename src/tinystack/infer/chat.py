"""Chat messages -> one prompt string: the model's chat template, or a simple built-in role format.

    chat_template.jinja, or tokenizer_config.json's "chat_template"
                                               -> render it with Jinja2 in a sandbox, as
                                                  Hugging Face's apply_chat_template does
                                                  (messages, add_generation_prompt=True,
                                                  bos_token, eos_token, raise_exception)
    otherwise                                  -> "system: ...\\nuser: ...\\nassistant:"

A template that fails to render (bad template, or it rejects the conversation via
raise_exception) is the client's 400, with the template's message.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered into a prompt."""


def load_chat_template(model_dir: str | Path | None) -> str | None:
    """`model_dir/chat_template.jinja` (where transformers >= 4.43 saves it; it wins, as there), else
    `chat_template` of `model_dir/tokenizer_config.json` (the "default" one if it is a list), or None."""
    if model_dir is None:
        return None
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8") or None
    path = Path(model_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


class ChatFormatter:
    def __init__(self, template: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.template_source = template
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = None
        if template is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(template)

    def render(self, messages: list[dict[str, str]]) -> str:
        """messages: [{"role", "content"}] (content already text) -> the prompt to continue."""
        if self._template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        try:
            return self._template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                         eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError) as e:
            raise ChatTemplateError(f"chat template failed: {e}") from None
