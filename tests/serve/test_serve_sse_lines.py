"""Every server-sent event is one whole line for any line splitter, whatever text the model produces.

The SSE spec ends lines at CR / LF only, but common clients split with Python's `str.splitlines()`
(httpx's `aiter_lines`, and so our own load generator), which also breaks at U+0085, U+2028 and
U+2029. JSON allows those raw inside a string, so a token whose text holds one used to cut its
`data:` line in two for such a client: `Unterminated string` (seen as a "truncated stream" in the
replicas benchmark). The server writes them as JSON escapes instead: the same value, one line.
"""
from __future__ import annotations

import json
import random

import httpx
import pytest
import torch
from serve_helpers import tiny_gpt

from tinystack.config import InferConfig
from tinystack.infer import AsyncEngine, LLMEngine
from tinystack.serve.api.openai_service import sse
from tinystack.tokenizer import BPETokenizer

SPLITTERS = "\x85\u2028\u2029"  # str.splitlines() breaks here; json.dumps(ensure_ascii=False) leaves them raw


@pytest.mark.parametrize("char", list(SPLITTERS))
def test_an_event_holding_a_line_separator_is_one_line_with_the_same_value(char):
    data = {"choices": [{"text": f"a{char}b{char}", "index": 0}], "note": "é ü 中"}
    frame = sse(data).decode()
    lines = [line for line in frame.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("data: ")
    assert json.loads(lines[0][6:]) == data
    assert "é ü 中" in lines[0]  # other text stays as it is (not \\u-escaped)


@pytest.fixture(scope="module")
def separator_tokenizer() -> tuple[BPETokenizer, int]:
    """A tokenizer with a token whose whole text is U+2028 (trained on text full of it)."""
    rng = random.Random(0)
    words = "return the number of items in the list".split()
    tok = BPETokenizer.train([" ".join(rng.choice(words) for _ in range(5)) + "\u2028x" for _ in range(200)],
                             vocab_size=300)
    token = next(i for i in range(tok.vocab_size) if tok.decode([i]) == "\u2028")
    return tok, token


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_of_line_separator_tokens_parses_line_by_line(serve, separator_tokenizer, route):
    tok, token = separator_tokenizer
    model = tiny_gpt(tok)
    with torch.no_grad():  # the final hidden state is constant and points at the token: greedy always picks it
        model.transformer.wte.weight[token] *= 10
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(model.transformer.wte.weight[token])
    engine = AsyncEngine(LLMEngine(model, tok, InferConfig(max_num_seqs=4, num_kv_blocks=32)))
    try:
        served = serve(engine)
        body = {"max_tokens": 4, "stream": True, "temperature": 0, "ignore_eos": True,
                "logprobs": True if route.endswith("chat/completions") else 2}
        body.update({"messages": [{"role": "user", "content": "return the"}]} if "chat" in route
                    else {"prompt": "return the"})
        with httpx.stream("POST", served.url + route, json=body, timeout=30) as r:
            assert r.status_code == 200, r.read()
            lines = [line for line in r.iter_lines() if line]  # str.splitlines() semantics
        assert lines[-1] == "data: [DONE]" and all(line.startswith("data: {") for line in lines[:-1]), lines
        events = [json.loads(line[6:]) for line in lines[:-1]]  # whole JSON: never cut at a separator
        text = ""
        for event in events:
            for choice in event["choices"]:
                text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        assert text == "\u2028" * 4
    finally:
        engine.shutdown()
