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

The calls a model is asked for are written as TOOL_CALL_OPEN {"name": ..., "arguments": ...} TOOL_CALL_CLOSE:
the server constrains and parses exactly this text (serve/api/tools.py).
"""
from __future__ import annotations

import json
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def call_text(name: str, arguments: Any) -> str:
    """One call as the fallback format (and the server's constraint) writes it; `arguments` a dict or JSON text."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}{TOOL_CALL_CLOSE}'


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
            f'{TOOL_CALL_OPEN}{{"name": <function-name>, "arguments": <arguments-json-object>}}{TOOL_CALL_CLOSE}')


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """Messages with tool calls, tool results and tools written as plain {"role", "content"} turns (see the module
    docstring): what a template without a tool section can render."""
    out: list[dict[str, str]] = []
    for m in messages:
        content = m.get("content") or ""
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        elif m.get("tool_calls"):
            calls = "".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
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
