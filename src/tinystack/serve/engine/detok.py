"""Token ids -> text deltas, as tokens arrive, with stop strings.

    push(token_id) -> the new text that is safe to send now ("" while a multi-byte
                      character is cut, or while the tail could still become a stop string)
    stopped        -> True once a stop string appeared; `text` ends just before it
    flush()        -> whatever was held back, when the generation ends without a stop

The whole output is re-decoded on every token (outputs are at most a few hundred
tokens), so a character split across tokens is never emitted as U+FFFD halves.
"""
from __future__ import annotations

from typing import Callable, Sequence


class IncrementalText:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = ()) -> None:
        self._decode = decode
        self.stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""  # the output so far (cut at the stop string once stopped)
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        full = self._decode(self.token_ids)
        if full.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        self.text = full
        if self.stops:
            start = max(0, self.sent - self._hold)
            hits = [i for i in (full.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.text = full[:min(hits)]
                self.stopped = True
                return self._take(len(self.text))
        return self._take(max(self.sent, len(full) - self._hold))

    def flush(self) -> str:
        """The rest of the text (at the end of the generation)."""
        if not self.stopped:
            self.text = self._decode(self.token_ids)
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out
