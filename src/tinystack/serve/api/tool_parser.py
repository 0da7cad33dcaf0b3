"""Tool calls out of an answer's text, incrementally: the same parser builds a whole answer and a stream's deltas.

    ToolCallParser(fmt, max_calls)     fmt: how the model writes a call (infer/chat_tools.ToolCallFormat)
    feed(text) -> events, finish() -> events; an event is one of
        ("content", text)              text of the answer that is no call
        ("call", index, id, name)      a call began (its id is "call_<random>")
        ("arguments", index, text)     the next piece of that call's arguments (JSON text)

Rules (so that no markup ever reaches `content`, and a stream's pieces add up to the whole answer):
  - text that could be the start of a call (the format's trigger: <tool_call>, or {"name") is held back until it
    is known not to be;
  - whitespace at the end of the text so far is held back until real text follows: before a call or at the
    end of the answer it is dropped (the newline between two calls is no content);
  - a call is `open` {"name": "<name>", "<args key>": <arguments>} `close`; its arguments are the JSON value after
    the key, found by scanning it (strings and escapes known, braces counted), so they are sent as they are
    generated and their pieces concatenated are exactly the final `arguments`;
  - text after the trigger that cannot be a call's beginning is given back as content, unparsed;
  - an answer cut by max_tokens inside a call keeps that call with the arguments generated so far (possibly
    incomplete JSON; finish_reason "length" says so); one cut before its name is complete is dropped;
  - calls after `max_calls` (parallel_tool_calls: false, or a format of one call) are parsed but not reported.
The text is what the constraint (tools.py) makes the model write.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from tinystack.infer.chat_tools import ToolCallFormat

Event = tuple
_WS = " \t\r\n"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (it may become the marker)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _header(buf: str, args_key: str) -> tuple[str, str, int]:
    """Match `{"name": "<name>", "<args_key>":` (any JSON whitespace between) at the start of `buf`:
    ("yes", name, end), ("more", "", 0) while `buf` may still become one, or ("no", "", 0)."""
    i, n = 0, len(buf)

    def skip(i: int) -> int:
        while i < n and buf[i] in _WS:
            i += 1
        return i

    for literal in ("{", '"name"', ":", None, ",", f'"{args_key}"', ":"):
        i = skip(i)
        if literal is None:  # the name: a JSON string
            if i == n:
                return "more", "", 0
            if buf[i] != '"':
                return "no", "", 0
            j = i + 1
            while j < n and buf[j] != '"':
                j += 2 if buf[j] == "\\" else 1
            if j >= n:
                return "more", "", 0
            name, i = buf[i:j + 1], j + 1
            continue
        piece = buf[i:i + len(literal)]
        if piece != literal[:len(piece)]:
            return "no", "", 0
        if len(piece) < len(literal):
            return "more", "", 0
        i += len(literal)
    return "yes", json.loads(name), i


class _JsonValueEnd:
    """Where a JSON value (the arguments) ends, fed piece by piece: scan(text) -> the index just past the value's
    end in `text`, or -1 when it goes on."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escape, self.started = 0, False, False, False

    def scan(self, text: str) -> int:
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif ch == '"':
                self.in_string, self.started = True, True
            elif ch in "{[":
                self.depth, self.started = self.depth + 1, True
            elif ch in "}]":
                if self.depth == 0:  # a bare value (a number, true, ...) ended at its call's closing brace
                    return i
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif ch == "," and self.depth == 0 and self.started:
                return i
            elif ch not in _WS:
                self.started = True
        return -1


class ToolCallParser:
    def __init__(self, fmt: ToolCallFormat, max_calls: int | None = None) -> None:
        self.fmt, self.max_calls = fmt, max_calls
        self.calls: list[dict[str, Any]] = []  # every reported call: {"id", "type", "function": {name, arguments}}
        self.content = ""
        self._buf = ""
        self._state = "text"  # text | header | arguments | end
        self._seen = 0  # calls parsed, reported or not
        self._value: _JsonValueEnd | None = None  # the current call's arguments, once they have begun

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
        buf, fmt = self._buf, self.fmt
        if self._state == "text":
            at = buf.find(fmt.trigger)
            if at >= 0:
                self._content(out, buf[:at].rstrip())
                self._buf, self._state = buf[at + len(fmt.open):], "header"
                return True
            keep = len(buf[:len(buf) - held_prefix(buf, fmt.trigger)].rstrip())  # whitespace waits for text
            self._content(out, buf[:keep])
            self._buf = buf[keep:]
            return False
        if self._state == "header":
            verdict, name, end = _header(buf, fmt.args_key)
            if verdict == "more":
                return False
            if verdict == "no":  # not a call: give the trigger back as text (fmt.open, or the object's "{")
                head = fmt.open or buf[:1]
                self._content(out, head)
                self._buf, self._state = buf[len(head) - len(fmt.open):], "text"
                return True
            self._seen += 1
            if self._reporting():
                call = {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": ""}}
                self.calls.append(call)
                out.append(("call", len(self.calls) - 1, call["id"], name))
            self._buf, self._state, self._value = buf[end:], "arguments", None
            return True
        if self._state == "arguments":
            if self._value is None:  # the arguments' leading whitespace is no part of them
                buf = buf.lstrip(_WS)
                if not buf:
                    self._buf = ""
                    return False
                self._value = _JsonValueEnd()
            end = self._value.scan(buf)
            self._arguments(out, buf if end < 0 else buf[:end])
            self._buf = "" if end < 0 else buf[end:]
            if end >= 0:
                self._state = "end"
            return end >= 0
        # "end": the call's closing brace and the format's close marker, whitespace allowed before each
        rest = buf.lstrip(_WS)
        if rest.startswith("}"):
            rest = rest[1:].lstrip(_WS)
        elif not rest:
            self._buf = buf
            return False
        if fmt.close and not rest.startswith(fmt.close) and fmt.close.startswith(rest):
            self._buf = buf
            return False  # the marker may be arriving
        self._buf, self._state = rest.removeprefix(fmt.close), "text"
        return True

    def finish(self) -> list[Event]:
        """The answer ended: what was held back, as the rules in the module docstring say."""
        out: list[Event] = []
        if self._state == "text":
            self._content(out, self._buf.rstrip())
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
