"""The server does what its /openapi.json says: integer fields take 5.0 (JSON Schema's "integer"), the
streaming endpoints declare text/event-stream, rules between fields are stated, and unknown keys are
refused at every level, `messages[]` included (OpenAI's answer-only message fields are accepted as null)."""
import json
import re
import time

import httpx
import pytest
from openai.types.chat import ChatCompletionMessage
from serve_helpers import PROMPT

from tinystack.serve.api.openai_schemas import MAX_PROMPTS

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": PROMPT}]


@pytest.fixture
def served(serve, async_engine):
    return serve(async_engine)


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served.url, timeout=20) as c:
        yield c


def test_integer_valued_floats_are_integers(client):
    as_int = {"prompt": PROMPT, "max_tokens": 4, "seed": 158221790, "n": 2, "top_k": 5, "logprobs": 1}
    as_float = {k: float(v) if isinstance(v, int) else v for k, v in as_int.items()}
    a, b = client.post(COMPLETIONS, json=as_int), client.post(COMPLETIONS, json=as_float)
    assert a.status_code == b.status_code == 200, b.text
    assert [c["text"] for c in a.json()["choices"]] == [c["text"] for c in b.json()["choices"]]  # same seed
    assert b.json()["usage"]["completion_tokens"] <= 8 and len(b.json()["choices"]) == 2
    r = client.post(CHAT, json={"messages": USER, "max_completion_tokens": 3.0, "logprobs": True,
                                "top_logprobs": 2.0, "seed": 1.0})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    r = client.post("/generate", json={"prompt": PROMPT, "max_tokens": 3.0, "top_k": 2.0, "seed": 7.0})
    assert r.status_code == 200 and r.json()["completion_tokens"] <= 3
    # a fraction, a boolean or a string is still no integer; the ranges still hold
    for bad, status in ((2.5, 400), (True, 400), ("3", 400), (0.0, 400), (1e300, 400)):
        r = client.post(COMPLETIONS, json={"prompt": PROMPT, "max_tokens": bad})
        assert r.status_code == status and r.json()["error"]["param"] == "max_tokens", (bad, r.text)
    assert client.post("/generate", json={"prompt": PROMPT, "seed": -1.0}).status_code == 422


def test_a_whole_number_is_read_exactly_however_it_is_written(client):
    # json.loads would make 9223372036854775807.0 the float 2**63, over seed's maximum that the number meets
    body = '{"prompt": "%s", "max_tokens": 3, "seed": %s, "temperature": 1.0}'
    answers = [client.post(COMPLETIONS, content=body % (PROMPT, seed), headers={"content-type": "application/json"})
               for seed in ("9223372036854775807", "9223372036854775807.0", "9.223372036854775807e18")]
    assert [r.status_code for r in answers] == [200] * 3, answers[1].text
    assert len({r.json()["choices"][0]["text"] for r in answers}) == 1  # one seed, one answer
    t0 = time.monotonic()  # an exponent this size is not expanded into digits: a quick 400
    r = client.post(COMPLETIONS, content=body % (PROMPT, "1e999999999"), headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed" and time.monotonic() - t0 < 5


def test_the_schema_declares_streams_and_the_rules_between_fields(client, served):
    schema = client.get("/openapi.json").json()
    for path in (COMPLETIONS, CHAT):
        content = schema["paths"][path]["post"]["responses"]["200"]["content"]
        assert {"application/json", "text/event-stream"} <= set(content), path
        assert content["text/event-stream"]["schema"]["properties"]["data"]["type"] == "string"
    parts = schema["components"]["schemas"]
    chat = parts["ChatCompletionRequest"]
    conditions = {next(iter(r["if"]["required"])): r["then"] for r in chat["allOf"] if "if" in r}
    assert conditions["continue_final_message"]["properties"] == {"add_generation_prompt": {"const": False}}
    assert conditions["top_logprobs"]["properties"] == {"logprobs": {"const": True}}
    assert conditions["tool_choice"]["required"] == ["tools"] and conditions["stream_options"]["required"] == ["stream"]
    assert set(conditions) == {"continue_final_message", "top_logprobs", "tool_choice", "stream_options"}
    assert parts["ChatMessage"]["additionalProperties"] is False
    stop = parts["CompletionRequest"]["properties"]["stop"]["anyOf"]
    assert {"type": "string", "minLength": 1} in stop and any(s.get("maxItems") == 4 for s in stop)
    prompt = parts["CompletionRequest"]["properties"]["prompt"]["oneOf"]  # text, ids, or a batch of either
    prompt_list = next(s for s in prompt if s["type"] == "array" and s["items"]["type"] == "string")
    assert prompt_list["minItems"] == 1 and prompt_list["maxItems"] == MAX_PROMPTS
    last = served.engine.engine.tokenizer.vocab_size - 1  # the served schema has the model's vocabulary in it
    ids = {"items": {"type": "integer", "minimum": 0, "maximum": last}, "minItems": 1, "type": "array"}
    assert ids in prompt and {"items": ids, "minItems": 1, "maxItems": MAX_PROMPTS, "type": "array"} in prompt


def test_the_served_schema_carries_this_servers_limits(serve, async_engine):
    served = serve(async_engine, max_tokens_limit=7, max_n=3)
    parts = httpx.get(f"{served.url}/openapi.json", timeout=10).json()["components"]["schemas"]
    last = async_engine.engine.tokenizer.vocab_size - 1
    chat, completion = parts["ChatCompletionRequest"]["properties"], parts["CompletionRequest"]["properties"]
    integer = lambda prop: next(b for b in prop.get("anyOf", [prop]) if b.get("type") == "integer")  # noqa: E731
    for props in (chat, completion, parts["GenerateRequest"]["properties"]):
        assert integer(props["max_tokens"])["maximum"] == integer(props["min_tokens"])["maximum"] == 7
    assert integer(chat["max_completion_tokens"])["maximum"] == 7
    assert chat["n"]["maximum"] == completion["n"]["maximum"] == 3
    assert chat["stop_token_ids"]["anyOf"][0]["items"]["maximum"] == last
    assert parts["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == last
    pattern = re.compile(chat["logit_bias"]["propertyNames"]["pattern"])
    assert pattern.match(str(last)) and pattern.match("0") and not pattern.match(str(last + 1))
    assert not any("x-token-id" in json.dumps(p) for p in parts.values())  # the marks are replaced, not served


def test_what_the_schema_refuses_the_server_refuses(client):
    cases = [
        (CHAT, {"messages": USER, "continue_final_message": True}, "continue_final_message"),  # needs agp false
        (CHAT, {"messages": USER, "top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        (CHAT, {"messages": USER, "tool_choice": "auto"}, "tool_choice"),  # needs tools
        (CHAT, {"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),  # needs stream
        (CHAT, {"messages": USER, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),  # the server's
        (CHAT, {"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages.0.colour"),
        (CHAT, {"messages": [{"role": "assistant", "content": "hi", "refusal": "no"}, *USER]}, "messages.0.refusal"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]},
         "messages.0.content.0.x"),
        (COMPLETIONS, {"prompt": PROMPT, "stop": ""}, "stop"),
        (COMPLETIONS, {"prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (COMPLETIONS, {"prompt": [], "max_tokens": 2}, "prompt"),
        (COMPLETIONS, {"prompt": ["a"] * (MAX_PROMPTS + 1), "max_tokens": 2}, "prompt"),
        (COMPLETIONS, {"prompt": PROMPT, "timeout": 5e-324}, "timeout"),  # a 400, not a 504 from client input
        (COMPLETIONS, {"prompt": [1, "b"], "max_tokens": 2}, "prompt.0"),  # neither texts nor token ids
    ]
    for route, body, param in cases:
        r = client.post(route, json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and param in err["message"], (body, err)
        assert "constrained-str" not in err["message"] and "list[" not in err["message"], err  # no pydantic tags


def test_max_completion_tokens_is_the_newer_name_and_wins_over_max_tokens(client):
    both = client.post(CHAT, json={"messages": USER, "max_tokens": 6, "max_completion_tokens": 2, "ignore_eos": True})
    assert both.status_code == 200 and both.json()["usage"]["completion_tokens"] == 2, both.text


def test_an_answer_echoed_back_by_the_openai_client_is_accepted(client):
    r = client.post(CHAT, json={"messages": USER, "max_tokens": 3})
    assert r.status_code == 200
    echoed = ChatCompletionMessage.model_validate(r.json()["choices"][0]["message"]).model_dump()
    assert {"refusal", "tool_calls"} <= set(echoed)  # what the client adds: null fields we never produce
    r = client.post(CHAT, json={"messages": [*USER, echoed, {"role": "user", "content": "and?", "name": "ann"}],
                                "max_tokens": 3})
    assert r.status_code == 200, r.text
