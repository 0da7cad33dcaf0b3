"""Tool calls out of an answer's text, incrementally: the same parser builds a whole answer and a stream's deltas.

    feed(text) -> events, finish() -> events; an event is one of
        ("content", text)              text of the answer that is no call
        ("call", index, id, name)      a call began (its id is "call_<random>")
        ("arguments", index, text)     the next piece of that call's arguments (JSON text)

Rules (so that no markup ever reaches `content`, and a stream's pieces add up to the whole answer):
  - text that could be the start of <tool_call> is held back until it is known not to be;
  - whitespace at the end of the text so far is held back until real text follows: before a call or at the
    end of the answer it is dropped (the newline between two calls is no content);
  - a call's arguments are everything between `"arguments": ` and `}</tool_call>`, without surrounding
    whitespace; the end marker (and any whitespace before it) is held back until it is complete, so the
    `arguments` pieces of a call concatenated are exactly its final `arguments`;
  - an answer cut by max_tokens inside a call keeps that call with the arguments generated so far (possibly
    incomplete JSON; finish_reason "length" says so); one cut before its name is complete is dropped;
  - calls after `max_calls` (parallel_tool_calls: false) are parsed but not reported.
The text is what the constraint (tools.py) makes the model write; anything between <tool_call> and
</tool_call> that does not start with {"name": "...", "arguments": is given back as content, unparsed.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from tinystack.infer.chat_tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

Event = tuple
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:')
_HEADER_MAX = 512  # a header longer than this without a match is not one


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (it may become the marker)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolCallParser:
    def __init__(self, max_calls: int | None = None) -> None:
        self.max_calls = max_calls
        self.calls: list[dict[str, Any]] = []  # every reported call: {"id", "type", "function": {name, arguments}}
        self.content = ""
        self._buf = ""
        self._state = "text"  # text | header | arguments
        self._seen = 0  # calls parsed, reported or not
        self._started = False  # the current call's arguments have begun (leading whitespace skipped)

    # ---------------------------------------------------------------- events
    def _content(self, out: list[Event], text: str) -> None:
        if text:
            self.content += text
            out.append(("content", text))

    def _reporting(self) -> bool:
        return self.max_calls is None or self._seen <= self.max_calls

    def _arguments(self, out: list[Event], text: str) -> None:
        if text and self._reporting():
            self.calls[-1]["function"]["arguments"] += text
            out.append(("arguments", len(self.calls) - 1, text))

    # ---------------------------------------------------------------- parsing
    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Event]) -> bool:
        """Advance as far as the buffer allows; True when the state changed (go on)."""
        buf = self._buf
        if self._state == "text":
            at = buf.find(TOOL_CALL_OPEN)
            if at >= 0:
                self._content(out, buf[:at].rstrip())
                self._buf, self._state = buf[at + len(TOOL_CALL_OPEN):], "header"
                return True
            keep = len(buf[:len(buf) - _held_prefix(buf, TOOL_CALL_OPEN)].rstrip())  # whitespace waits for text
            self._content(out, buf[:keep])
            self._buf = buf[keep:]
            return False
        if self._state == "header":
            m = _HEADER.match(buf)
            if m is None:
                if TOOL_CALL_CLOSE in buf or len(buf) > _HEADER_MAX:  # not a call of ours: give it back as text
                    self._content(out, TOOL_CALL_OPEN + buf)
                    self._buf, self._state = "", "text"
                    return True
                return False
            self._seen += 1
            if self._reporting():
                call = {"id": new_call_id(), "type": "function",
                        "function": {"name": json.loads(m.group(1)), "arguments": ""}}
                self.calls.append(call)
                out.append(("call", len(self.calls) - 1, call["id"], call["function"]["name"]))
            self._buf, self._state, self._started = buf[m.end():], "arguments", False
            return True
        if not self._started:  # the arguments' leading whitespace is no part of them
            buf = self._buf = buf.lstrip()
            self._started = bool(buf)
        end = buf.find(TOOL_CALL_CLOSE)
        if end >= 0:
            body = buf[:end].rstrip()
            self._arguments(out, body[:-1].rstrip() if body.endswith("}") else body)
            self._buf, self._state = buf[end + len(TOOL_CALL_CLOSE):], "text"
            return True
        brace = buf.rfind("}")
        safe = buf[:brace] if brace >= 0 and TOOL_CALL_CLOSE.startswith(buf[brace + 1:].lstrip()) else buf
        safe = safe.rstrip()  # whitespace may be followed by the end marker
        self._arguments(out, safe)
        self._buf = buf[len(safe):]
        return False

    def finish(self) -> list[Event]:
        """The answer ended: what was held back, as the rules in the module docstring say."""
        out: list[Event] = []
        if self._state == "text":
            self._content(out, self._buf.rstrip())
        elif self._state == "arguments":
            self._arguments(out, self._buf)
        self._buf = ""
        return out


def delta(events: list[Event]) -> dict[str, Any]:
    """A chat.completion.chunk `delta` for these events: content, and tool_calls entries by index (a call's first
    entry has its id, type and name; the following ones only arguments)."""
    out: dict[str, Any] = {}
    content = "".join(e[1] for e in events if e[0] == "content")
    if content:
        out["content"] = content
    calls: list[dict[str, Any]] = []
    for e in events:
        if e[0] == "call":
            calls.append({"index": e[1], "id": e[2], "type": "function", "function": {"name": e[3], "arguments": ""}})
        elif e[0] == "arguments":
            if calls and calls[-1]["index"] == e[1]:
                calls[-1]["function"]["arguments"] += e[2]
            else:
                calls.append({"index": e[1], "function": {"arguments": e[2]}})
    if calls:
        out["tool_calls"] = calls
    return out


def finish_reason(parser: ToolCallParser, reason: str | None) -> str | None:
    """"tool_calls" for an answer that ended by itself with calls; "length" stays (a call may be incomplete)."""
    return "tool_calls" if reason == "stop" and parser.calls else reason


def message(parser: ToolCallParser) -> dict[str, Any]:
    """The whole answer's message: content null when there is no text besides the calls."""
    out: dict[str, Any] = {"role": "assistant", "content": parser.content or None}
    if parser.calls:
        out["tool_calls"] = parser.calls
    return out
