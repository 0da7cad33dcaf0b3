"""The server does what its /openapi.json says: integer fields take 5.0 (JSON Schema's "integer"), the
streaming endpoints declare text/event-stream, rules between fields are stated, and unknown keys are
refused at every level, `messages[]` included (OpenAI's answer-only message fields are accepted as null)."""
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


def test_the_schema_declares_streams_and_the_rules_between_fields(client):
    schema = client.get("/openapi.json").json()
    for path in (COMPLETIONS, CHAT):
        content = schema["paths"][path]["post"]["responses"]["200"]["content"]
        assert {"application/json", "text/event-stream"} <= set(content), path
        assert content["text/event-stream"]["schema"]["properties"]["data"]["type"] == "string"
    parts = schema["components"]["schemas"]
    chat = parts["ChatCompletionRequest"]
    assert {"not": {"required": ["max_tokens", "max_completion_tokens"]}} in chat["allOf"]
    assert any(r["not"].get("properties", {}).get("continue_final_message") == {"const": True} for r in chat["allOf"])
    assert "not both" in chat["properties"]["max_completion_tokens"]["description"]
    assert parts["ChatMessage"]["additionalProperties"] is False
    stop = parts["CompletionRequest"]["properties"]["stop"]["anyOf"]
    assert {"type": "string", "minLength": 1} in stop and any(s.get("maxItems") == 4 for s in stop)
    prompt = parts["CompletionRequest"]["properties"]["prompt"]["oneOf"]  # text, ids, or a batch of either
    prompt_list = next(s for s in prompt if s["type"] == "array" and s["items"]["type"] == "string")
    assert prompt_list["minItems"] == 1 and prompt_list["maxItems"] == MAX_PROMPTS
    ids = {"items": {"type": "integer", "minimum": 0}, "minItems": 1, "type": "array"}
    assert ids in prompt and {"items": ids, "minItems": 1, "maxItems": MAX_PROMPTS, "type": "array"} in prompt


def test_what_the_schema_refuses_the_server_refuses(client):
    cases = [
        (CHAT, {"messages": USER, "max_tokens": 2, "max_completion_tokens": 2}, "max_completion_tokens"),
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


def test_an_answer_echoed_back_by_the_openai_client_is_accepted(client):
    r = client.post(CHAT, json={"messages": USER, "max_tokens": 3})
    assert r.status_code == 200
    echoed = ChatCompletionMessage.model_validate(r.json()["choices"][0]["message"]).model_dump()
    assert {"refusal", "tool_calls"} <= set(echoed)  # what the client adds: null fields we never produce
    r = client.post(CHAT, json={"messages": [*USER, echoed, {"role": "user", "content": "and?", "name": "ann"}],
                                "max_tokens": 3})
    assert r.status_code == 200, r.text
