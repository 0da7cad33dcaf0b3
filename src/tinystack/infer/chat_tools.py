"""Tool calls in a chat prompt: the messages as a template sees them, and the fallback for templates without tools.

Messages arrive in OpenAI's shape: an assistant turn may carry `tool_calls` ([{"id", "type": "function",
"function": {"name", "arguments": JSON text}}], content null) and a `tool` turn answers one call
(`tool_call_id`, content). `hf_messages` gives them as Hugging Face's apply_chat_template passes them to a
template: `function.arguments` parsed into a dict (templates write it with `tojson`), content "" for null.

A template that has a tool section (its text mentions `tools`) renders them itself, with `tools=` the OpenAI
tool dicts. One that does not (SmolLM2's) gets `fallback_messages`, the one documented format (docs/serve.md):

    system turn   its content, then "# Tools" + one JSON line per tool between <tools></tools> and the rule
                  "to call a function, answer with <tool_call>{"name": ..., "arguments": ...}</tool_call>";
                  a system turn is added first when the conversation has none
    assistant     its content, a newline, then each call as <tool_call>{"name": "f", "arguments": {...}}</tool_call>
                  (one right after the other, as the server's constraint writes them)
    tool          a user turn: "<tool_response>\\n{content}\\n</tool_response>"

How a model writes a call is its template's business; `tool_call_format(template)` reads it off the template text
and the server constrains and parses exactly that text (serve/api/tools.py, serve/api/tool_parser.py):

    HERMES        <tool_call>{"name": "f", "arguments": {...}}</tool_call>, several per answer: the format of
                  templates that write <tool_call> (Qwen2.5, Qwen3, Hermes) and of the fallback above
    LLAMA3_JSON   {"name": "f", "parameters": {...}}, one per answer, no markup: Llama 3.1 / 3.2 / 3.3 templates
                  (they ask for "parameters" and give tool results the `ipython` role; they refuse a turn
                  with two calls)

A template with a tool section in neither format gets HERMES for what the model answers (docs/serve.md).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCallFormat:
    """One call is `open` {"name": "<function>", "<args_key>": <JSON object>} `close`."""

    name: str
    open: str
    close: str
    args_key: str
    parallel: bool  # an answer may hold several calls, one right after the other

    @property
    def trigger(self) -> str:
        """The text that starts a call in a free answer (a JSON-only format has no markup: the object itself)."""
        return self.open or '{"name"'

    def begin(self, name: str) -> str:
        """A call's text up to its arguments."""
        return f'{self.open}{{"name": {json.dumps(name, ensure_ascii=False)}, "{self.args_key}": '

    @property
    def end(self) -> str:
        """A call's text after its arguments."""
        return "}" + self.close

    def call_text(self, name: str, arguments: Any) -> str:
        """One call as this format writes it; `arguments` a dict or JSON text."""
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return self.begin(name) + args + self.end


HERMES = ToolCallFormat("hermes", "<tool_call>", "</tool_call>", "arguments", parallel=True)
LLAMA3_JSON = ToolCallFormat("llama3_json", "", "", "parameters", parallel=False)


def tool_call_format(template: str | None) -> ToolCallFormat:
    """The format a chat template asks its model to call tools in (see the module docstring)."""
    if template and "<tool_call>" not in template and '"parameters"' in template and "ipython" in template:
        return LLAMA3_JSON
    return HERMES


def _arguments(text: Any) -> Any:
    """A call's arguments as a template expects them: the JSON text parsed (a dict), or the text when it is not
    JSON (a client's own history may hold anything; the template writes what it gets)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages -> the dicts apply_chat_template gives a template (content "" for null, arguments parsed)."""
    out = []
    for m in messages:
        msg = {**m, "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(fn["arguments"])}}
                                 for c in m["tool_calls"] for fn in [c["function"]]]
        out.append({k: v for k, v in msg.items() if v is not None})
    return out


def tools_preamble(tools: list[dict[str, Any]]) -> str:
    """The fallback's description of the tools, appended to the system turn."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to answer the user. The functions are listed in "
            f"<tools></tools>:\n<tools>\n{lines}\n</tools>\n\nTo call a function, answer with:\n"
            f'{HERMES.open}{{"name": <function-name>, "arguments": <arguments-json-object>}}{HERMES.close}')


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """Messages with tool calls, tool results and tools written as plain {"role", "content"} turns (see the module
    docstring): what a template without a tool section can render."""
    out: list[dict[str, str]] = []
    for m in messages:
        content = m.get("content") or ""
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        elif m.get("tool_calls"):
            calls = "".join(HERMES.call_text(c["function"]["name"], c["function"]["arguments"])
                            for c in m["tool_calls"])
            out.append({"role": m["role"], "content": f"{content}\n{calls}" if content else calls})
        else:
            out.append({"role": m["role"], "content": content})
    if tools:
        preamble = tools_preamble(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out
