"""Bad-input fuzzing: schemathesis generates requests from the server's own OpenAPI schema
(valid bodies, and invalid ones: wrong types, missing fields, out-of-range values) and sends
them to the real uvicorn server. No answer may be a 5xx, every error has the OpenAI shape, and every
answer agrees with the schema: its status and content type are declared (text/event-stream for a
stream), its body (each event of a stream) fits, and what the schema forbids is refused. What it allows is
accepted: the served schema carries this server's limits (max_tokens_limit 8, max_n 2, the vocabulary's ids), so a
schema-valid body is refused only for what no JSON Schema can say, each with its own code
(errors.UNDECLARED_REFUSALS: the prompt's tokens against the context, a constraint that does not compile, the
chat template's refusals, rules by value or name between fields), never with invalid_value.
The engine's tokenizer is the tiny model directory's tokenizer.json loaded as a server loads it, so the
structured-output fields (response_format, structured_outputs, tools, tool_choice) the schema describes are
compiled for real: random JSON Schemas, regexes and grammars must be 400s or answers, never a 5xx or a hang.

(The operations are driven with hypothesis directly: schemathesis' pytest plugin does not
load under pytest 9.)
"""
from dataclasses import replace

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CHECKS, load_all_checks
from serve_helpers import unbatched

from tinystack.serve.api.deps import ADMIN_ROUTES
from tinystack.serve.api.errors import UNDECLARED_REFUSALS
from tinystack.tokenizer import load_tokenizer

ERROR_KEYS = {"message", "type", "param", "code"}
EXAMPLES = 20  # per operation and mode: ~ (6 + 3) operations x 20 = 180 requests
load_all_checks()
# schemathesis' `--checks all` but positive_data_acceptance, which wants a 2xx for every schema-valid body: ours is
# stricter where it can be (below: answered, or refused only with an UNDECLARED_REFUSALS code, never invalid_value)
CHECKS_ALL = [check for check in CHECKS.get_all() if check.__name__ != "positive_data_acceptance"]


@pytest.fixture
def fuzz_target(serve, model_dir, tiny_model):
    # a compile limit well under the request timeout: a random schema that compiles slowly is a 400, not a 504
    engine = unbatched(tiny_model, load_tokenizer(model_dir))
    engine.engine.config = replace(engine.engine.config, structured_compile_timeout_s=1.0)
    try:
        served = serve(engine, max_tokens_limit=8, default_max_tokens=4, max_n=2, timeout_s=5)
        yield served.url, schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    finally:
        engine.shutdown()


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_no_5xx_and_openai_error_shape(fuzz_target, mode):
    url, schema = fuzz_target
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    seen: dict[int, int] = {}
    refused: dict[str, int] = {}
    for op in operations:
        if mode == schemathesis.GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # a GET without parameters has no invalid form
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            response = case.call(base_url=url, timeout=20)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            own_deadline = isinstance(case.body, dict) and case.body.get("timeout") is not None
            if response.status_code == 504 and own_deadline:
                return  # the request chose a deadline too short to generate in: 504 is the documented answer
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
            if response.status_code >= 400:
                assert set(response.json()["error"]) == ERROR_KEYS, response.text[:300]
            if mode == schemathesis.GenerationMode.POSITIVE and response.status_code in (401, 403):
                assert case.path in ADMIN_ROUTES, case.path  # the admin routes need their keys (off here)
            elif mode == schemathesis.GenerationMode.POSITIVE and 400 <= response.status_code < 500:
                refused[response.json()["error"]["code"]] = refused.get(response.json()["error"]["code"], 0) + 1
                assert response.json()["error"]["code"] in UNDECLARED_REFUSALS, (  # the schema allowed it
                    case.method, case.path, case.body, response.text[:300])
            case.validate_response(response, checks=CHECKS_ALL)

        check()
    if mode == schemathesis.GenerationMode.NEGATIVE:
        assert any(400 <= s < 500 for s in seen), seen  # the bad input was really sent and refused
    else:
        assert seen.get(200, 0) > sum(seen.values()) // 2, (seen, refused)  # most valid bodies were answered


def test_schema_lists_every_endpoint(serve, engine):
    served = serve(engine)
    paths = httpx.get(f"{served.url}/openapi.json", timeout=5).json()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/generate", "/health", "/ready"} <= set(paths)


def test_schema_describes_the_structured_output_fields(serve, engine):
    served = serve(engine)
    schemas = httpx.get(f"{served.url}/openapi.json", timeout=5).json()["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert {"response_format", "structured_outputs", "tools", "tool_choice", "parallel_tool_calls"} <= set(chat)
    assert {"response_format", "structured_outputs"} <= set(schemas["CompletionRequest"]["properties"])
    assert "structured_outputs" in schemas["GenerateRequest"]["properties"]
    assert {"json", "json_object", "regex", "choice", "grammar"} == set(schemas["StructuredOutputsBody"]["properties"])
    assert "schema" in schemas["JsonSchemaSpec"]["properties"]
