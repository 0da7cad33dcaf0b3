"""One chat choice's text -> its message: `reasoning_content` (when the model's template thinks), `content`, and
`tool_calls` (when the request has tools), incrementally, so a stream's deltas add up to the whole message.

    ChatAnswer(reasoning_opened, tools)   reasoning_opened: None = the template does not think; else whether the
                                          prompt already opened the thinking block (reasoning.py)
    feed(text, final) -> delta dict       {"reasoning_content"?, "content"?, "tool_calls"?}
    message() -> dict, finish_reason(engine's reason) -> str | None

The thinking is split off first; only what follows it goes to the tool-call parser (a model may think about a
call before it makes one).
"""
from __future__ import annotations

from typing import Any

from tinystack.serve.api.reasoning import ReasoningParser
from tinystack.serve.api.tool_parser import ToolCallParser, delta, finish_reason, message
from tinystack.serve.api.tools import ToolPlan


class ChatAnswer:
    def __init__(self, reasoning_opened: bool | None, tools: ToolPlan | None) -> None:
        self.thinking = ReasoningParser(reasoning_opened) if reasoning_opened is not None else None
        self.calls = ToolCallParser(tools.format, tools.max_calls) if tools is not None else None
        self.content = ""

    def feed(self, text: str, final: bool) -> dict[str, Any]:
        if self.thinking is not None:
            events = self.thinking.feed(text) + (self.thinking.finish() if final else [])
        else:
            events = [("content", text)]
        reasoning = "".join(t for kind, t in events if kind == "reasoning")
        content = "".join(t for kind, t in events if kind == "content")
        if self.calls is not None:
            out = delta(self.calls.feed(content) + (self.calls.finish() if final else []))
        else:
            self.content += content
            out = {"content": content} if content else {}
        return {"reasoning_content": reasoning, **out} if reasoning else out

    def message(self) -> dict[str, Any]:
        out = message(self.calls) if self.calls is not None else {"role": "assistant", "content": self.content}
        if self.thinking is not None:
            out["content"] = out["content"] or None
            out["reasoning_content"] = self.thinking.reasoning or None
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return finish_reason(self.calls, reason) if self.calls is not None else reason
