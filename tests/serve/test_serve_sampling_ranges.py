"""Sampling parameters are declared once (SamplingParams' table, infer/sampler.py's KNOBS): each range is enforced
identically by SamplingParams, generation_config.json, `tinystack generate`, /v1/completions, /v1/chat/completions
and /generate, and the request schemas are made from the table (a parameter added there appears everywhere)."""
import json

import httpx
import pytest
from pydantic import create_model
from serve_helpers import PROMPT
from typer.testing import CliRunner

from tinystack.cli import app as cli
from tinystack.config import ServeConfig
from tinystack.model.generation_config import sampling_defaults
from tinystack.sampling_params import KNOBS, Knob, SamplingParams
from tinystack.serve import create_app
from tinystack.serve.api import openai_schemas, schemas
from tinystack.serve.api.requests import body_sampling

CLI_LACKS = ("logprobs",)  # the terminal prints text: no logprobs flag


def _values(knob: Knob) -> tuple[list, list]:
    """(values the range allows: its closed ends, values it refuses: just outside each end)."""
    step = 1 if knob.kind is int else 0.5
    b, good, bad = knob.bounds, [], []
    if "ge" in b:
        good, bad = good + [b["ge"]], bad + [b["ge"] - step]
    if "gt" in b:
        good, bad = good + [b["gt"] + (1 if knob.kind is int else 1e-3)], bad + [b["gt"]]
    if "le" in b:
        good, bad = good + [b["le"]], bad + [b["le"] + step]
    return good, bad


def _openai(name: str, value, chat: bool) -> tuple[str, dict]:
    """The route and body asking for `value` of `name` (chat's logprobs are `logprobs: true, top_logprobs: n`)."""
    body = {"max_tokens": 2, name: value}
    if chat:
        body = {**body, "messages": [{"role": "user", "content": PROMPT}]}
        if name == "logprobs":
            body = {"max_tokens": 2, "messages": body["messages"], "logprobs": True, "top_logprobs": value}
        return "/v1/chat/completions", body
    return "/v1/completions", {**body, "prompt": PROMPT}


def _cli(name: str, value, tmp_path) -> Exception | None:
    flag = "--" + name.replace("_", "-")
    res = CliRunner().invoke(cli, ["generate", "--model", str(tmp_path / "absent"), "--prompt", "x", flag, str(value)])
    return res.exception


@pytest.mark.parametrize("name", list(KNOBS))
def test_each_range_is_enforced_identically_at_every_entry_point(name, serve, engine, tmp_path):
    knob = KNOBS[name]
    good, bad = _values(knob)
    assert bad, f"{name} has no range"
    served = serve(engine)
    with httpx.Client(base_url=served.url, timeout=30) as c:
        for value in bad:
            with pytest.raises(ValueError, match=f"^{name} must be ") as e:  # the engine's own type
                SamplingParams(**{name: value})
            assert "\n" not in str(e.value)
            if knob.model_default:
                (tmp_path / "generation_config.json").write_text(json.dumps({name: value}))
                with pytest.raises(ValueError, match=f"generation_config.json: {name} must be "):
                    sampling_defaults(tmp_path)
            if name not in CLI_LACKS:
                error = _cli(name, value, tmp_path)
                assert error is not None and str(error).startswith(f"--{name.replace('_', '-')}: {name} must be ")
            for chat in (False, True):
                route, body = _openai(name, value, chat)
                r = c.post(route, json=body)
                err = r.json()["error"]
                assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}, r.text
                assert err["param"] == ("top_logprobs" if chat and name == "logprobs" else name), r.text
            if name != "logprobs":  # /generate answers no logprobs
                r = c.post("/generate", json={"prompt": PROMPT, "max_tokens": 2, name: value})
                assert r.status_code == 422 and r.json()["error"]["param"] == name, r.text
        for value in good:
            assert getattr(SamplingParams(**{name: value}), name) == knob.alias.get(value, value)
            if knob.model_default:
                (tmp_path / "generation_config.json").write_text(json.dumps({name: value}))
                assert sampling_defaults(tmp_path) == {name: knob.alias.get(value, value)}
            if name not in CLI_LACKS:  # past the flag checks: it fails on the absent model, not on the value
                assert f"--{name.replace('_', '-')}" not in str(_cli(name, value, tmp_path))
            for chat in (False, True):
                route, body = _openai(name, value, chat)
                r = c.post(route, json=body)
                assert r.status_code == 200, r.text
            if name != "logprobs":
                r = c.post("/generate", json={"prompt": PROMPT, "max_tokens": 2, name: value})
                assert r.status_code == 200, r.text


def _bounds_in_schema(prop: dict) -> dict:
    """A property's range in /openapi.json, in pydantic's names (an optional field's is inside anyOf)."""
    prop = next((p for p in prop.get("anyOf", []) if p.get("type") != "null"), prop)
    names = {"minimum": "ge", "exclusiveMinimum": "gt", "maximum": "le", "exclusiveMaximum": "lt"}
    return {names[k]: v for k, v in prop.items() if k in names}


def test_the_request_schemas_are_made_from_the_table(engine):
    """Every sampling parameter, and nothing else, is a field of each request body, with the table's range and
    default; /openapi.json states the range."""
    table = set(KNOBS)
    others = set(openai_schemas._Fields.model_fields)
    assert set(schemas.GenerateRequest.model_fields) == {"prompt", "structured_outputs"} | table - set(
        schemas.GENERATE_EXCLUDES)
    assert set(openai_schemas.CompletionRequest.model_fields) == others | {"prompt", "echo"} | table
    chat_own = {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", "tools",
                "tool_choice", "parallel_tool_calls", "add_generation_prompt", "continue_final_message",
                "chat_template_kwargs"}
    assert set(openai_schemas.ChatCompletionRequest.model_fields) == others | chat_own | table
    spec = create_app(engine, ServeConfig()).openapi()["components"]["schemas"]
    for model in ("GenerateRequest", "CompletionRequest", "ChatCompletionRequest"):
        for name, knob in KNOBS.items():
            shown = "top_logprobs" if model == "ChatCompletionRequest" and name == "logprobs" else name
            if shown in spec[model]["properties"]:
                shown_bounds = _bounds_in_schema(spec[model]["properties"][shown])  # JSON numbers: compare as floats
                assert {k: float(v) for k, v in shown_bounds.items()} == {k: float(v) for k, v in knob.bounds.items()}
    generate = spec["GenerateRequest"]["properties"]
    assert all(generate[n].get("default") == k.default for n, k in KNOBS.items() if n in generate)


def test_a_parameter_added_to_the_table_is_all_it_takes(monkeypatch, tmp_path):
    """A new knob in the table: the request schemas' fields, what a body hands to SamplingParams and what
    generation_config.json may set all follow it, with its range."""
    knob = Knob("typical_p", 1.0, float, "Locally typical sampling; 1 = off.", True, {}, {"gt": 0.0, "le": 1.0})
    monkeypatch.setitem(KNOBS, "typical_p", knob)
    body_type = create_model("Body", __base__=schemas.RequestBody, **schemas.sampling_fields())
    assert set(body_type.model_fields) == set(KNOBS)
    with pytest.raises(ValueError, match="typical_p"):
        body_type.model_validate({"typical_p": 0.0})
    body = body_type.model_validate({"typical_p": 0.5})

    class State:
        sampling_defaults: dict = {}
    assert body_sampling(State(), body)["typical_p"] == 0.5
    (tmp_path / "generation_config.json").write_text(json.dumps({"typical_p": 0.9}))
    assert sampling_defaults(tmp_path) == {"typical_p": 0.9}
    (tmp_path / "generation_config.json").write_text(json.dumps({"typical_p": 1.5}))
    with pytest.raises(ValueError, match=r"typical_p must be in \(0.0, 1.0\], got 1.5"):
        sampling_defaults(tmp_path)
