"""/v1/completions as lm-evaluation-harness' `local-completions` model calls it: a batch of token-id prompts with
`echo`, `max_tokens: 1` and `logprobs: 1`. Each choice echoes its own prompt, scored token by token as the
eval layer scores (eval.scoring), in the legacy completions shape (tokens, token_logprobs, top_logprobs,
text_offset); the harness' own reading of that answer (its parse_logprobs, restated here) gives the
continuation's log-likelihood that `tinystack eval` computes, and whether greedy decoding would have written it."""
import json

import httpx
import numpy as np
import openai
import pytest
import torch
from serve_helpers import PROMPT

from tinystack.eval.scoring import target_nats


def _lm_eval_reading(choice: dict, ctxlen: int) -> tuple[float, bool]:
    """lm_eval/models/openai_completions.py parse_logprobs, for one choice: the continuation's summed logprob
    (the echoed tokens after the context, the generated last one left out) and whether each was the top one."""
    lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    return sum(lps), all(lp == max(top.values()) for lp, top in zip(lps, tops))


def test_a_batch_of_token_prompts_echoes_each_scored_as_eval_scores_it(serve, engine):
    served = serve(engine)
    tok, model = engine.engine.tokenizer, engine.engine.model
    pairs = [(PROMPT, " the end"), ("an apple", " a day"), ("one two", " three four")]
    prompts = [tok.encode_ordinary(c) + tok.encode_ordinary(x) for c, x in pairs]
    r = httpx.post(f"{served.url}/v1/completions", timeout=30, json={
        "model": "m", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
        "echo": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choices = sorted(body["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts)) and body["usage"]["completion_tokens"] == 3
    for (context, _), ids, choice in zip(pairs, prompts, choices):
        lp = choice["logprobs"]
        assert choice["text"].startswith(tok.decode(ids)) and len(lp["tokens"]) == len(ids) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # the first token has no context
        assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-1]]))
        ctxlen = len(tok.encode_ordinary(context))
        got, greedy = _lm_eval_reading(choice, ctxlen)
        want = -target_nats(model, ids[:ctxlen], ids[ctxlen:]).sum()
        assert got == pytest.approx(want, abs=1e-4)
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0][0, ctxlen - 1:-1]
        assert greedy == bool((logits.argmax(-1) == torch.tensor(ids[ctxlen:])).all())


def test_batches_of_strings_give_n_choices_per_prompt_in_openais_order(serve, engine):
    served = serve(engine, max_n=4)
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=30) as client:
        r = client.completions.create(model="m", prompt=["first prompt", "second one"], n=2, max_tokens=3,
                                      echo=True, temperature=0)
    assert [c.index for c in sorted(r.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    texts = {c.index: c.text for c in r.choices}
    assert texts[0].startswith("first prompt") and texts[1].startswith("first prompt")
    assert texts[2].startswith("second one") and texts[3].startswith("second one")
    assert texts[0] == texts[1]  # greedy: a prompt's n choices agree


def test_a_streamed_echo_starts_each_choice_with_its_prompt(serve, engine):
    served = serve(engine)
    body = {"prompt": [PROMPT, "another prompt"], "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2}
    whole = httpx.post(f"{served.url}/v1/completions", json=body, timeout=30).json()
    texts, tokens = {0: "", 1: ""}, {0: [], 1: []}
    with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "stream": True}, timeout=30) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] += c["text"]
                    tokens[c["index"]] += c["logprobs"]["tokens"] if c["logprobs"] else []
    for c in whole["choices"]:
        assert texts[c["index"]] == c["text"] and tokens[c["index"]] == c["logprobs"]["tokens"]


def test_bad_batches_are_400s_naming_prompt(serve, engine):
    served = serve(engine, max_queued_requests=0)
    vocab = engine.engine.tokenizer.vocab_size
    capacity = engine.engine.scheduler.max_num_seqs
    for prompt in ([[1, 2], []], [[1, 2], [vocab]], [[1], [-1]], ["a"] * (capacity + 1), []):
        r = httpx.post(f"{served.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt"), (prompt, r.text)
