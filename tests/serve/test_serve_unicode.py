"""Text that is no Unicode: a lone UTF-16 surrogate (legal as a JSON escape) anywhere in a body is a 400
`invalid_unicode` naming its place, counted as a validation failure, never a 500 or an engine error."""
import json

import httpx
import pytest
from obs_helpers import scrape, value
from serve_helpers import PROMPT, wait_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def user(content, **extra):
    return {"messages": [{"role": "user", "content": content, **extra}], "max_tokens": 2}


# (route, body, the param the error names); "\ud800" / "\udc00" stay unpaired after json.dumps -> json.loads
CASES = [
    ("/generate", {"prompt": "a\ud800b"}, "prompt"),
    (COMPLETIONS, {"prompt": "a\ud800b", "max_tokens": 2}, "prompt"),
    (COMPLETIONS, {"prompt": ["\udc00"], "max_tokens": 2}, "prompt.0"),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "stop": "\udc00"}, "stop"),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "stop": ["ok", "x\ud800"]}, "stop.1"),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "user": "\ud800"}, "user"),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "model": "m\udfff"}, "model"),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "logit_bias": {"\ud800": 1}}, "logit_bias.\\ud800"),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "\udc00": 1}, "\\udc00"),
    (CHAT, user("a\ud800b"), "messages.0.content"),
    (CHAT, user([{"type": "text", "text": "\ud800"}]), "messages.0.content.0.text"),
    (CHAT, user("hi", name="\ud800"), "messages.0.name"),
    (CHAT, user("hi", **{"\ud800": 1}), "messages.0.\\ud800"),
    (CHAT, {**user("hi"), "stop": "\udc00"}, "stop"),
]


@pytest.fixture
def served(serve, async_engine):
    return serve(async_engine)


@pytest.mark.parametrize("route,body,param", CASES, ids=[c[2] + "@" + c[0] for c in CASES])
def test_an_unpaired_surrogate_is_a_400_naming_its_place(served, route, body, param):
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as the JSON escape \udXXX
    assert "\\ud" in raw
    r = httpx.post(served.url + route, content=raw, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "invalid_unicode" and err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert err["message"].startswith(f"{param}: ") and "surrogate" in err["message"]


def test_surrogate_bodies_count_as_validation_failures_not_engine_errors(serve, async_engine):
    served = serve(async_engine, log=True, include_text=True)
    before = scrape(served.url)
    for route, body, _ in CASES:
        r = httpx.post(served.url + route, content=json.dumps(body), headers={"content-type": "application/json"},
                       timeout=10)
        assert r.status_code == 400
    # a valid pair (an emoji, sent escaped) is ordinary text
    r = httpx.post(served.url + COMPLETIONS, content=json.dumps({"prompt": "\U0001F600 ok", "max_tokens": 2}),
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text
    after = scrape(served.url)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("tinystack_request_failures_total", reason="validation") == len(CASES)
    assert delta("tinystack_request_failures_total", reason="engine_error") == 0
    assert served.state.counters["engine_failures"] == 0

    def lines():
        return [json.loads(line) for line in served.log_path.read_text(encoding="utf-8").splitlines()]

    assert wait_for(lambda: sum(r.get("status") == 400 for r in lines()) == len(CASES))
    bad = [(r["status"], r["error_code"], r["failure"]) for r in lines() if r.get("status") == 400]
    assert bad == [(400, "invalid_unicode", "validation")] * len(CASES)  # one line each, readable JSON
