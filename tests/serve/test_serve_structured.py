"""Structured outputs and tools through the real server and the real `openai` client, on SmolLM2-135M-Instruct
(float32, greedy): every constrained answer validates, tool calls come back as `tool_calls` (whole and streamed)
with no markup in `content`, and every bad constraint is a 400 naming its field. One server for the module."""
import json
import time
from dataclasses import replace

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tinystack.config import InferConfig, ServeConfig
from tinystack.infer import AsyncEngine, LLMEngine, load_for_inference
from tinystack.serve import create_app, run_in_background

pytestmark = pytest.mark.slow
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "max_tokens": 40}
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def server(smollm2_dir):
    model, tok = load_for_inference(smollm2_dir, InferConfig(weight_format="float32"))
    engine = AsyncEngine(LLMEngine(model, tok, InferConfig(max_num_seqs=4, memory_limit_mb=1024)))
    app = create_app(engine, ServeConfig(), None, model_dir=smollm2_dir)
    try:
        with run_in_background(app, startup_timeout_s=30, shutdown_timeout_s=5) as url:
            yield url, engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", timeout=120, max_retries=0)


def _post(server, path, body):
    return httpx.post(server[0] + path, json=body, timeout=120)


def _args(call) -> dict:
    fn = call["function"] if isinstance(call, dict) else call.function
    return json.loads(fn["arguments"] if isinstance(fn, dict) else fn.arguments)


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": "Name a city in Italy as JSON."}],
        response_format=City, temperature=0, max_tokens=60)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City) and choice.message.parsed.name


@pytest.mark.parametrize("route,field,constraint,check", [
    ("chat", "response_format", {"type": "json_object"}, lambda t: json.loads(t) == {"ok": True}),
    ("chat", "response_format", {"type": "json_schema", "json_schema": {"name": "n", "schema": ANSWER}},
     lambda t: jsonschema.validate(json.loads(t), ANSWER) is None),
    ("chat", "structured_outputs", {"choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    ("completions", "structured_outputs", {"regex": "[0-9]{3}-[a-z]{2}"}, lambda t: len(t) == 6 and t[3] == "-"),
    ("completions", "structured_outputs", {"grammar": 'start: "A" | "B" "!"'}, lambda t: t in ("A", "B!")),
    ("completions", "structured_outputs", {"json": {"type": "array", "items": {"type": "boolean"},
                                                    "minItems": 1, "maxItems": 2}},
     lambda t: 1 <= len(json.loads(t)) <= 2 and all(isinstance(x, bool) for x in json.loads(t))),
])
def test_every_finished_constrained_answer_matches(server, route, field, constraint, check):
    body = {field: constraint, **GREEDY, "max_tokens": 60}
    if route == "chat":
        r = _post(server, "/v1/chat/completions", {**body, "messages": [
            {"role": "user", "content": "Return {\"ok\": true} as JSON."}]})
        text = r.json()["choices"][0]["message"]["content"]
    else:
        r = _post(server, "/v1/completions", {**body, "prompt": "The code is"})
        text = r.json()["choices"][0]["text"]
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop", r.text
    assert check(text), text


def test_generate_takes_structured_outputs(server):
    r = _post(server, "/generate", {"prompt": "Is the sky blue?", "structured_outputs": {"choice": ["yes", "no"]},
                                    "temperature": 0, "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json()["text"] in ("yes", "no") and r.json()["finish_reason"] == "stop"


def test_a_tools_round_trip(client, server):
    first = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           **GREEDY)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
    jsonschema.validate(_args(call), schema)
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"}]
    # the tool's answer is in the prompt the model continues (the fallback format: a tool_response turn)
    ids = _post(server, "/tokenize", {"messages": history})
    assert ids.status_code == 200, ids.text
    prompt = server[1].engine.tokenizer.decode(ids.json()["tokens"])
    assert "<tool_response>\nSunny, 24 C\n</tool_response>" in prompt and '"name": "get_weather"' in prompt
    final = client.chat.completions.create(model="m", messages=history, tools=[WEATHER, TIME], **GREEDY)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert "<tool_call>" not in (answer.message.content or "") and "</tool_call>" not in (answer.message.content or "")
    assert answer.message.tool_calls or answer.message.content


def test_streamed_tool_calls_assemble_into_the_whole_answer(client):
    kwargs = dict(model="m", messages=ASK, tools=[WEATHER, TIME],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, **GREEDY)
    whole = client.chat.completions.create(**kwargs).choices[0]
    calls: list[dict] = []
    content, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                if tc.index == len(calls):
                    assert tc.id and tc.type == "function" and tc.function.name  # once, on the first piece
                    calls.append({"name": tc.function.name, "arguments": ""})
                else:
                    assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert calls == [{"name": "get_weather", "arguments": whole.message.tool_calls[0].function.arguments}]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


def test_tool_choice_none_and_auto_and_parallel_false(server):
    none = _post(server, "/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "tool_choice": "none",
                                                  **GREEDY}).json()["choices"][0]
    assert "tool_calls" not in none["message"] and none["finish_reason"] in ("stop", "length")
    assert isinstance(none["message"]["content"], str)
    one = _post(server, "/v1/chat/completions", {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required",
                                                 "parallel_tool_calls": False, **GREEDY}).json()["choices"][0]
    assert len(one["message"]["tool_calls"]) == 1 and one["finish_reason"] == "tool_calls"
    auto = _post(server, "/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "n": 2, "temperature": 1,
                                                  "seed": 3, "max_tokens": 30}).json()
    for choice in auto["choices"]:  # whatever the model chose: no markup in content, calls that validate
        msg = choice["message"]
        assert "<tool_call>" not in (msg["content"] or "")
        for call in msg.get("tool_calls", []):
            assert call["function"]["name"] == "get_weather"
            if choice["finish_reason"] == "tool_calls":
                jsonschema.validate(_args(call), WEATHER["function"]["parameters"])


BAD = [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "foo"}}}}, "response_format", "Invalid type"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"not": {"type": "string"}}}}}, "response_format", "not"),
    ("/v1/completions", {"structured_outputs": {"regex": "(abc"}}, "structured_outputs", "unclosed group"),
    ("/v1/completions", {"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs", "foo"),
    ("/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ("/v1/completions", {"structured_outputs": {"json_object": True}, "response_format": {"type": "json_object"}},
     "structured_outputs", "not both"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "nope"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice", "needs tools"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}]}, "tools.0.function.parameters", '"type": "object"'),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}}}]}, "tools", "look-around"),
    ("/v1/chat/completions", {"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format",
     "tools"),
]


@pytest.mark.parametrize("path,body,param,words", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_constraints_are_400s_naming_the_field(server, path, body, param, words):
    base = {"messages": ASK} if "chat" in path else {"prompt": "x"}
    r = _post(server, path, {**base, **body, "max_tokens": 4})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_a_compile_over_the_time_limit_is_a_400(server, monkeypatch):
    # a compile made to take 1 s against a 0.1 s limit: llguidance's own compile takes milliseconds, and a 1e-6 s
    # limit against it raced the caller's wait (the compile finished first once under make test's two workers)
    from tinystack.infer.structured import grammar

    real = grammar._build
    monkeypatch.setattr(grammar, "_build", lambda *a: (time.sleep(1.0), real(*a))[1])
    llm = server[1].engine
    saved = llm.config
    llm.config = replace(saved, structured_compile_timeout_s=0.1)
    try:  # a schema never compiled before (the cache would answer at once)
        schema = {"type": "object", "properties": {"over_the_served_limit": {"type": "integer"}}}
        r = _post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "slow", "schema": schema}}})
    finally:
        llm.config = saved
    assert "longer than" in r.json()["error"]["message"]


# A template in Llama 3.1's tool format (written here after Meta's description of it: tools listed with the
# instruction to answer {"name": ..., "parameters": ...}, tool results in `ipython` turns, one call per turn)
LLAMA31_STYLE = """{{- bos_token }}
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
To call a function, respond with JSON in the format {"name": function name, "parameters": dictionary of argument \
name and its value}. Do not use variables.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for m in messages %}
{%- if m.role == "tool" %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- elif m.tool_calls %}
{%- if m.tool_calls | length != 1 %}{{ raise_exception("This model only supports single tool-calls at once!") }}\
{% endif %}
{%- set call = m.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ call.name }}", "parameters": {{ call.arguments | tojson }}}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""


def test_a_llama31_style_template_gets_its_own_call_format(server, smollm2_dir, tmp_path):
    # the same engine behind a server whose model directory has that template: the model is asked, constrained and
    # parsed in "parameters" JSON, never in <tool_call> markup, whole and streamed, and its history renders
    model_dir = tmp_path / "llama-style"
    model_dir.mkdir()
    for f in smollm2_dir.iterdir():
        (model_dir / f.name).symlink_to(f)
    (model_dir / "chat_template.jinja").write_text(LLAMA31_STYLE)
    app = create_app(server[1], ServeConfig(), None, model_dir=model_dir)
    with run_in_background(app, startup_timeout_s=30, shutdown_timeout_s=5) as url:
        llama = (url, server[1])
        body = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required", **GREEDY}
        r = _post(llama, "/v1/chat/completions", {**body, "logprobs": True})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
        written = "".join(t["token"] for t in choice["logprobs"]["content"])  # what the model wrote, unparsed
        assert written.startswith('{"name": "') and '"parameters": {' in written and "tool_call" not in written
        calls = choice["message"]["tool_calls"]
        assert len(calls) == 1  # the format holds one call per turn, parallel_tool_calls or not
        name = calls[0]["function"]["name"]
        jsonschema.validate(_args(calls[0]), {"get_weather": WEATHER, "get_time": TIME}[name]["function"]["parameters"])
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        pieces = [tc for e in events for c in e["choices"] for tc in c["delta"].get("tool_calls", [])]
        assert "".join(tc["function"]["arguments"] for tc in pieces) == calls[0]["function"]["arguments"]
        assert all("content" not in c["delta"] or not c["delta"]["content"] for e in events for c in e["choices"])
        history = ASK + [choice["message"], {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Sunny"}]
        prompt = server[1].engine.tokenizer.decode(_post(llama, "/tokenize", {"messages": history,
                                                                              "tools": [WEATHER]}).json()["tokens"])
        assert f'{{"name": "{name}", "parameters": ' in prompt and "ipython<|end_header_id|>\n\nSunny" in prompt
        assert '"parameters": dictionary of argument name' in prompt and "<tool_call>" not in prompt
