"""A reasoning model's thinking out of its answer, incrementally: `message.reasoning_content` /
`delta.reasoning_content` (vLLM's and llama.cpp's shape), the rest as `content`.

    ReasoningParser(opened)     opened: the prompt already opened a thinking block (its template wrote <think>
                                after the assistant's turn opening, as Qwen3's thinking models and DeepSeek-R1's do)
    feed(text) -> events, finish() -> events; an event is ("reasoning", text) or ("content", text)

Rules (a stream's pieces add up to the whole answer's fields, and no marker reaches either field):
  - the answer thinks when the prompt opened the block, or when it starts with <think> (after whitespace);
    otherwise it is all content (a template asked not to think writes an empty block into the prompt itself);
  - the thinking ends at </think>; whitespace right after it is dropped; the rest is content;
  - text that could be the start of a marker is held back until it is known not to be;
  - an answer cut inside its thinking (finish_reason "length") has reasoning and no content.
The server uses it when the model's chat template writes <think> (infer.chat.ChatFormatter.reasoning); content
goes on to the tool-call parser when the request has tools.
"""
from __future__ import annotations

from tinystack.serve.api.tool_parser import held_prefix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def prompt_opens_thinking(prompt: str) -> bool:
    """The rendered prompt ends inside a thinking block (its last <think> is not closed)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


class ReasoningParser:
    def __init__(self, opened: bool) -> None:
        self.reasoning, self.content = "", ""
        self._buf = ""
        self._state = "thinking" if opened else "start"  # start | thinking | after | content

    def _emit(self, out: list[tuple[str, str]], kind: str, text: str) -> None:
        if text:
            setattr(self, kind, getattr(self, kind) + text)
            out.append((kind, text))

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        out: list[tuple[str, str]] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[tuple[str, str]]) -> bool:
        buf = self._buf
        if self._state == "start":
            head = buf.lstrip()
            if head.startswith(THINK_OPEN):
                self._buf, self._state = head[len(THINK_OPEN):], "thinking"
                return True
            if THINK_OPEN.startswith(head):  # empty, or a piece of the marker: wait
                return False
            self._state = "content"
            return True
        if self._state == "thinking":
            at = buf.find(THINK_CLOSE)
            if at >= 0:
                self._emit(out, "reasoning", buf[:at])
                self._buf, self._state = buf[at + len(THINK_CLOSE):], "after"
                return True
            keep = len(buf) - held_prefix(buf, THINK_CLOSE)
            self._emit(out, "reasoning", buf[:keep])
            self._buf = buf[keep:]
            return False
        if self._state == "after":  # whitespace between the thinking and the answer is neither
            self._buf = buf.lstrip()
            if not self._buf:
                return False
            self._state = "content"
            return True
        self._emit(out, "content", buf)
        self._buf = ""
        return False

    def finish(self) -> list[tuple[str, str]]:
        """The answer ended: what was held back goes where its state says."""
        out: list[tuple[str, str]] = []
        if self._state == "thinking":
            self._emit(out, "reasoning", self._buf)
        elif self._state in ("start", "content"):
            self._emit(out, "content", self._buf)
        self._buf = ""
        return out
