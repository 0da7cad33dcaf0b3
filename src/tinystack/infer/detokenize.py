"""A sequence's text and what a step hands out for it: the text cut at stop strings, the delta since the last
step (whole characters only), and the finished RequestOutput. The engine (llm_engine.py) calls these after it
appends tokens; they touch only the sequence."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from tinystack.infer.outputs import RequestOutput, TokenDelta
from tinystack.infer.sequence import Sequence


def detokenize(tokenizer: Any, seq: Sequence) -> None:
    """seq.text = the output so far, cut before the first stop string (which finishes the sequence; not before
    params.min_tokens were generated)."""
    text = tokenizer.decode(seq.output_ids)
    for s in seq.params.stop if len(seq.output_ids) >= seq.params.min_tokens else ():
        cut = text.find(s, max(0, len(seq.text) - len(s)))
        if cut >= 0:
            text, seq.finish_reason = text[:cut], "stop"
    seq.text = text


def make_delta(tokenizer: Any, seq: Sequence, stream_text: bool) -> TokenDelta | None:
    """The tokens (and, when streaming text, the characters) not handed out yet; None when there are none.
    Text that may be half a character or the start of a stop string is held back until it is known."""
    out = seq.output_ids
    finished = seq.finish_reason is not None
    if finished and not (seq.params.stop or stream_text):
        seq.text = tokenizer.decode(out)
    new_ids = out[seq.tokens_streamed:]
    logprobs = seq.logprobs[seq.tokens_streamed:] if seq.params.logprobs is not None else None
    seq.tokens_streamed = len(out)
    text = ""
    if stream_text or finished:
        safe = len(seq.text)
        if not finished:
            while safe and seq.text[safe - 1] == "\ufffd":
                safe -= 1
            safe = max(seq.streamed, safe - max((len(s) for s in seq.params.stop), default=1) + 1)
        text, seq.streamed = seq.text[seq.streamed:safe], max(seq.streamed, safe)
    if not new_ids and not text and not finished:
        return None
    return TokenDelta(seq.request_id, new_ids, text, seq.finish_reason, request_output(seq) if finished else None,
                      logprobs)


def request_output(seq: Sequence) -> RequestOutput:
    """A copy of the sequence's record: an output does not change after it is handed out."""
    m = replace(seq.metrics, finished=time.perf_counter() if seq.finish_reason else None)
    return RequestOutput(seq.request_id, seq.prompt, list(seq.prompt_ids), seq.text, list(seq.output_ids),
                         seq.finish_reason, list(seq.logprobs) if seq.params.logprobs is not None else None, m,
                         seq.num_cached_prompt_tokens, seq.num_preemptions)
