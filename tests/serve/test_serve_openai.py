"""The official `openai` client against the real server: completions and chat, streaming and not."""
import json

import httpx
import openai
import pytest
from serve_helpers import PROMPT


@pytest.fixture(params=["engine", "async_engine"])
def served(request, serve):
    """The engine unbatched (max_num_seqs=1) and with continuous batching: same answers expected."""
    return serve(request.getfixturevalue(request.param), model_name="tiny", max_n=4)


@pytest.fixture
def client(served):
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=10) as c:
        yield c


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_text_usage_and_determinism(client, tokenizer):
    a = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0.8, seed=5)
    b = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0.8, seed=5)
    assert a.object == "text_completion" and a.model == "tiny"
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason in ("stop", "length")
    prompt_tokens = len(tokenizer.encode_ordinary(PROMPT))
    assert a.usage.prompt_tokens == prompt_tokens
    completion_ids = tokenizer.encode_ordinary(a.choices[0].text)
    assert a.usage.completion_tokens <= 8 and a.usage.total_tokens == prompt_tokens + a.usage.completion_tokens
    if a.choices[0].finish_reason == "length":
        assert a.usage.completion_tokens == 8
    assert tokenizer.decode(completion_ids) == a.choices[0].text


def test_streamed_completion_equals_the_whole_one_and_reports_usage(client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, n=1)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_whole_and_streamed(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "return the"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    msg = whole.choices[0].message
    assert whole.object == "chat.completion" and msg.role == "assistant" and isinstance(msg.content, str)
    assert whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens <= 8
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_n_choices_stop_and_logprobs(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, n=3, seed=1, temperature=1.0,
                                  logprobs=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
        assert "".join(lp.tokens) == c.text
        assert all(v <= 0 for v in lp.token_logprobs)
        assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    # stop: the text ends before the first occurrence of the stop string
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0).choices[0].text
    if len(full) > 3:
        stop = full[2:4]
        cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
        assert cut.choices[0].text == full[:full.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_chat_logprobs_and_extras(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       logprobs=True, top_logprobs=3, temperature=0.7, seed=2,
                                       extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3})
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 for t in content)


def test_response_format_text_is_the_default_and_json_is_refused(client):
    msgs = [{"role": "user", "content": "x"}]
    plain = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
    text = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}):
        with pytest.raises(openai.BadRequestError) as e:  # a JSON mode the output would not honour: never ignored
            client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, response_format=fmt)
        assert e.value.status_code == 400 and e.value.body["param"].startswith("response_format")


def test_errors_have_the_openai_shape_and_numbers(client, served):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=60)
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert "64" in err["message"] and "60" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, temperature=3.0)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=PROMPT, n=5)  # max_n = 4
    r = httpx.post(f"{served.url}/v1/chat/completions", content=b'{"messages": [', timeout=5,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_chat_template_from_tokenizer_config(serve, engine, tmp_path):
    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    served = serve(engine, model_dir=tmp_path)
    assert served.state.chat.render([{"role": "user", "content": "hi"}]) == "<user>hi<assistant>"
    r = httpx.post(f"{served.url}/v1/chat/completions", timeout=10,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == len(engine.engine.tokenizer.encode_ordinary("<user>hi<assistant>"))
    assert r.json()["model"] == tmp_path.name


def test_template_kwargs_and_a_prefilled_final_message_reach_the_template(serve, engine, tmp_path):
    # a Qwen3-like switch: the template reads `enable_thinking`; the prompt /tokenize shows is what the chat runs
    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% if enable_thinking is false %}<nothink>{% endif %}"
                "{% endif %}")
    (tmp_path / "chat_template.jinja").write_text(template)
    served = serve(engine, model_dir=tmp_path)
    tok = engine.engine.tokenizer
    hi = [{"role": "user", "content": "hi"}]

    def prompt(body: dict) -> tuple[int, str]:
        r = httpx.post(f"{served.url}/tokenize", timeout=10, json=body)
        return r.status_code, (tok.decode(r.json()["tokens"]) if r.status_code == 200 else r.json()["error"]["param"])

    assert prompt({"messages": hi}) == (200, "<user>hi</user><assistant>")
    assert prompt({"messages": hi, "chat_template_kwargs": {"enable_thinking": False, "unused": 1}}) == \
        (200, "<user>hi</user><assistant><nothink>")  # a name the template does not read is ignored (as HF)
    prefill = hi + [{"role": "assistant", "content": "The answer is"}]
    assert prompt({"messages": prefill, "add_generation_prompt": False, "continue_final_message": True}) == \
        (200, "<user>hi</user><assistant>The answer is")
    r = httpx.post(f"{served.url}/v1/chat/completions", timeout=10, json={
        "messages": prefill, "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 3,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == \
        len(tok.encode_ordinary("<user>hi</user><assistant>The answer is"))
    for extra, param in [({"continue_final_message": True}, "continue_final_message"),
                         ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
                         ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs")]:
        r = httpx.post(f"{served.url}/v1/chat/completions", timeout=10,
                       json={"messages": prefill, "max_tokens": 2, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)


def test_omitted_sampling_fields_take_the_models_generation_config(serve, engine, tmp_path):
    # the model asks for greedy (temperature 0) and a repetition penalty: requests that say nothing get both
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "repetition_penalty": 1.5,
                                                                  "do_sample": True, "eos_token_id": 0}))
    served = serve(engine, model_dir=tmp_path)
    assert served.state.sampling_defaults == {"temperature": 0.0, "repetition_penalty": 1.5}
    settings = httpx.get(f"{served.url}/metrics.json", timeout=5).json()["settings"]
    assert settings["sampling_defaults"] == {"temperature": 0.0, "repetition_penalty": 1.5}  # what operators see

    def text(url, **body):
        r = httpx.post(f"{url}/v1/completions", timeout=10,
                       json={"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, **body})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    omitted = {text(served.url, seed=s) for s in range(4)}
    assert omitted == {text(served.url, temperature=0.0, repetition_penalty=1.5)}  # greedy with the penalty
    sampled = {text(served.url, temperature=1.0, seed=s) for s in range(4)}  # what a request sets wins
    assert len(sampled) > 1
    r = httpx.post(f"{served.url}/generate", json={"prompt": PROMPT, "max_tokens": 12, "seed": 1}, timeout=10)
    assert r.status_code == 200  # /generate reads the same defaults: greedy, so any seed gives the same text
    assert r.json()["text"] == httpx.post(f"{served.url}/generate", timeout=10,
                                          json={"prompt": PROMPT, "max_tokens": 12, "seed": 2}).json()["text"]


def test_model_sampling_defaults_off_keeps_the_apis_own(serve, engine, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    served = serve(engine, model_dir=tmp_path, model_sampling_defaults=False)
    assert served.state.sampling_defaults == {}
    texts = set()
    for s in range(4):  # the API's temperature 1: seeds give different texts
        r = httpx.post(f"{served.url}/v1/completions", timeout=10,
                       json={"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "seed": s})
        texts.add(r.json()["choices"][0]["text"])
    assert len(texts) > 1


def test_logit_bias_steers_the_answer_and_bad_keys_are_400(serve, engine):
    served = serve(engine)
    tok = engine.engine.tokenizer
    token = tok.encode_ordinary(" the")[0]
    r = httpx.post(f"{served.url}/v1/completions", timeout=10, json={
        "prompt": PROMPT, "max_tokens": 5, "ignore_eos": True, "seed": 1, "logit_bias": {str(token): 100}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tok.decode([token] * 5)  # +100 wins every draw
    for bias, message in [({"the": 1}, "'the' is not a token id"), ({str(tok.vocab_size): 1}, "is not a token id"),
                          ({"-1": 1}, "is not a token id"), ({"٣": 1}, "is not a token id"),  # digits, but not ASCII
                          ({str(token): 150}, "less than or equal to 100")]:
        r = httpx.post(f"{served.url}/v1/chat/completions", timeout=10, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logit_bias": bias})
        assert r.status_code == 400, (bias, r.text)
        err = r.json()["error"]
        assert err["param"].startswith("logit_bias") and message in err["message"], err


def test_stop_token_ids_and_min_tokens_through_the_openai_client(serve, engine):
    served = serve(engine)
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=30)
    free = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    ids = engine.engine.tokenizer.encode_ordinary(free.choices[0].text)
    cut = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0,
                                    extra_body={"stop_token_ids": [ids[3]], "ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens == ids.index(ids[3])
    held = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"stop_token_ids": [ids[3]], "min_tokens": 12, "ignore_eos": True})
    assert held.usage.completion_tokens == 12 and ids[3] not in \
        engine.engine.tokenizer.encode_ordinary(held.choices[0].text)
    for extra, param in [({"stop_token_ids": [engine.engine.tokenizer.vocab_size]}, "stop_token_ids"),
                         ({"stop_token_ids": [-1]}, "stop_token_ids.0"), ({"min_tokens": 20}, "min_tokens"),
                         ({"min_tokens": -1}, "min_tokens")]:
        r = httpx.post(f"{served.url}/v1/completions", timeout=10,
                       json={"prompt": PROMPT, "max_tokens": 12, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)


def test_cached_tokens_count_the_prompt_tokens_the_prefix_cache_served(serve, engine):
    served = serve(engine)
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=30)
    block = engine.engine.config.kv_block_size
    long_prompt = "the quick brown fox jumps over a lazy dog and runs"
    first = client.completions.create(model="m", prompt=long_prompt, max_tokens=2, temperature=0)
    n = first.usage.prompt_tokens
    assert n > 2 * block and first.usage.prompt_tokens_details.cached_tokens == 0  # never seen: all computed
    again = client.completions.create(model="m", prompt=long_prompt, max_tokens=2, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % block == 0 and cached < n  # whole blocks; the last token is always computed
    streamed = list(client.completions.create(model="m", prompt=long_prompt, max_tokens=2, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == cached
    fresh = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "zebra " * 6}],
                                           max_tokens=2)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0


def test_tokenize_gives_the_ids_a_completion_or_chat_runs_and_detokenize_reverses_it(serve, engine):
    served = serve(engine)
    tok = engine.engine.tokenizer
    r = httpx.post(f"{served.url}/tokenize", json={"prompt": PROMPT}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode_ordinary(PROMPT) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == engine.engine.max_seq_len
    done = httpx.post(f"{served.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, timeout=10).json()
    assert done["usage"]["prompt_tokens"] == body["count"]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "return the value"}]
    chat = httpx.post(f"{served.url}/tokenize", json={"messages": messages}, timeout=10).json()
    answered = httpx.post(f"{served.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 1},
                          timeout=10).json()
    assert chat["count"] == answered["usage"]["prompt_tokens"]  # the chat as it is served, template included
    by_ids = httpx.post(f"{served.url}/v1/completions", timeout=10, json={
        "prompt": body["tokens"], "max_tokens": 6, "temperature": 0, "ignore_eos": True}).json()  # ids as a prompt
    by_text = httpx.post(f"{served.url}/v1/completions", timeout=10, json={
        "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == body["count"]
    r = httpx.post(f"{served.url}/v1/completions", json={"prompt": [1, tok.vocab_size], "max_tokens": 1}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert "is not in this model's vocabulary" in r.json()["error"]["message"]
    back = httpx.post(f"{served.url}/detokenize", json={"tokens": body["tokens"]}, timeout=10)
    assert back.status_code == 200 and back.json()["prompt"] == tok.decode(body["tokens"])
    for path, payload, status, param in [
            ("/detokenize", {"tokens": [tok.vocab_size]}, 400, "tokens"),
            ("/tokenize", {}, 400, "prompt"),
            ("/tokenize", {"prompt": "a", "messages": messages}, 400, "prompt"),
            ("/tokenize", {"prompt": None, "messages": messages}, 400, "prompt"),  # the schema's types: not null
            ("/detokenize", {"tokens": [-1]}, 400, "tokens.0")]:
        r = httpx.post(f"{served.url}{path}", json=payload, timeout=10)
        assert r.status_code == status and r.json()["error"]["param"] == param, (path, payload, r.text)


def test_priority_under_overload_serves_high_before_the_queued_low_ones(serve, engine):
    # one sequence at a time (the unbatched engine), the queue filled with low-priority requests, then high ones:
    # each high one waits for the running request at most, never for the queue ahead of it
    import asyncio
    import statistics

    served = serve(engine, max_queued_requests=16)

    async def burst() -> tuple[list[float], list[float]]:
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as c:
            def ask(priority: int):
                return c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True,
                                                       "temperature": 0, "priority": priority})
            low = [asyncio.create_task(ask(10)) for _ in range(6)]
            await asyncio.sleep(0.05)  # they are queued first
            high = [asyncio.create_task(ask(-10)) for _ in range(2)]
            done = await asyncio.gather(*low, *high)
        assert all(r.status_code == 200 for r in done), [r.text for r in done if r.status_code != 200]
        queue = [float(r.headers["x-queue-time"]) for r in done]
        return queue[:6], queue[6:]

    for _ in range(5):
        low, high = asyncio.run(burst())
        assert max(high) < statistics.median(low), (high, low)
    for bad in ("high", 1.5, 2**31, None):  # an integer, in vLLM's (int32) range
        r = httpx.post(f"{served.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "priority": bad},
                       timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority", (bad, r.text)
