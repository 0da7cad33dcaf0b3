"""LoRA adapters served by name from one engine ([serve] lora_modules, vLLM's --lora-modules): /v1/models lists the
base and each adapter (with its parent); a request's `model` picks one; concurrent requests for 3 adapters and
the base, batched together, answer what each adapter's merged model answers, token for token; an unknown name
is a 404 in the OpenAI error shape; a bad entry stops the start with one line naming it."""
import copy
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from obs_helpers import scrape, total
from serve_helpers import PROMPT, FaultyModel, random_lora, tiny_gpt, wait_for

from tinystack.config import InferConfig, ServeConfig
from tinystack.eval.registry import ModelRegistry
from tinystack.infer import LLM, AsyncEngine, LLMEngine
from tinystack.model.io import save_model
from tinystack.sampling_params import SamplingParams
from tinystack.serve import create_app

TARGETS = {"attn": ("c_attn",), "mlp": ("c_fc", "c_proj"), "all": ("c_attn", "c_proj", "c_fc")}
PROMPTS = [PROMPT, "the list of items", "return the"]


def _merged(base, adapter):
    """A copy of `base` with `adapter` merged into its weights by hand (W += s B A): the reference."""
    model = copy.deepcopy(base)
    with torch.no_grad():
        for path, (a, b) in (adapter.weights if adapter else {}).items():
            model.get_submodule(path).weight += adapter.scale * b @ a
    return model.eval()


def _merged_tokens(base, adapter, tokenizer) -> list[list[int]]:
    llm = LLM(_merged(base, adapter), tokenizer, weight_format="float32", memory_limit_mb=128)
    return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))]


@pytest.fixture
def lora_server(serve, tokenizer, tmp_path):
    base = tiny_gpt(tokenizer)
    adapters = {name: random_lora(base, targets, i) for i, (name, targets) in enumerate(TARGETS.items())}
    for name, adapter in adapters.items():
        adapter.save(tmp_path / name)
    engine = AsyncEngine(LLMEngine(copy.deepcopy(base), tokenizer, InferConfig(max_num_seqs=16, num_kv_blocks=64,
                                                                               weight_format="float32")))
    try:
        yield serve(engine, model_name="base", lora_modules=[f"{n}={tmp_path / n}" for n in adapters]), base, adapters
    finally:
        engine.shutdown()


def test_models_lists_the_adapters_and_each_answers_as_its_merged_model(lora_server, tokenizer):
    served, base, adapters = lora_server
    models = httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["base", *adapters]
    assert all(m["parent"] == "base" for m in models[1:]) and "parent" not in models[0]
    expected = {name: _merged_tokens(base, adapters.get(name), tokenizer) for name in ["base", *adapters]}
    assert all(expected[name] != expected["base"] for name in adapters)  # each adapter changes the answer
    asks = [(name, i) for _ in range(2) for name in ["base", *adapters] for i in range(len(PROMPTS))]

    def ask(job):
        name, i = job
        r = httpx.post(f"{served.url}/v1/completions", timeout=60, json={
            "model": name, "prompt": PROMPTS[i], "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["model"] == name, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(asks)) as pool:  # all at once: rows of every adapter share the engine's batches
        texts = list(pool.map(ask, asks))
    assert texts == [tokenizer.decode(expected[name][i]) for name, i in asks]


def test_an_unknown_model_is_a_404_and_the_base_answers_to_its_name(lora_server):
    served, *_ = lora_server
    r = httpx.post(f"{served.url}/v1/chat/completions", timeout=30, json={
        "model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"
    assert "nope" in r.json()["error"]["message"] and "attn" in r.json()["error"]["message"]
    for model in ("base", None):
        body = {"prompt": PROMPT, "max_tokens": 2, **({"model": model} if model else {})}
        assert httpx.post(f"{served.url}/v1/completions", timeout=30, json=body).status_code == 200


def test_a_bad_lora_module_entry_is_one_line(async_engine, tmp_path):
    for entry, message in [("noequals", "is not NAME=PATH"), (f"x={tmp_path / 'missing'}", "is not a directory")]:
        with pytest.raises(ValueError, match=message):
            create_app(async_engine, ServeConfig(lora_modules=[entry]))


def test_adapters_load_and_unload_at_run_time_behind_the_admin_key(serve, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_ADMIN_KEYS", "s3cret")
    slow = FaultyModel(tiny_gpt(tokenizer))  # each step sleeps delay_s: a request that runs while it is unloaded
    random_lora(slow, TARGETS["all"], 7).save(tmp_path / "late")
    engine = AsyncEngine(LLMEngine(copy.deepcopy(slow), tokenizer, InferConfig(max_num_seqs=4, num_kv_blocks=64)))
    admin = {"authorization": "Bearer s3cret"}
    try:
        url = serve(engine, model_name="base", admin_key_env="TEST_ADMIN_KEYS").url
        load = {"lora_name": "late", "lora_path": str(tmp_path / "late")}
        assert httpx.post(f"{url}/v1/load_lora_adapter", json=load, timeout=30).status_code == 401
        assert httpx.post(f"{url}/v1/load_lora_adapter", json=load, timeout=30,
                          headers={"authorization": "Bearer nope"}).status_code == 401
        r = httpx.post(f"{url}/v1/load_lora_adapter", json=load, timeout=30, headers=admin)
        assert r.status_code == 200 and r.json()["status"] == "loaded", r.text
        assert [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]] == ["base", "late"]
        again = httpx.post(f"{url}/v1/load_lora_adapter", json=load, timeout=30, headers=admin)
        assert again.status_code == 400 and "taken" in again.json()["error"]["message"]
        bad = httpx.post(f"{url}/v1/load_lora_adapter", headers=admin, timeout=30,
                         json={"lora_name": "x", "lora_path": str(tmp_path)})
        assert bad.status_code == 400 and "not a LoRA adapter directory" in bad.json()["error"]["message"]

        engine.engine.model.delay_s = 0.02
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={
                "model": "late", "prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "stream": True}) as s:
            events = s.iter_lines()
            next(events)  # the request runs with the adapter: unloading it now is refused, not a cut
            busy = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=30, headers=admin)
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "adapter_in_use", busy.text
            lines = [line for line in events if line]
        assert lines[-1] == "data: [DONE]" and all('"error"' not in line for line in lines)
        done = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=30, headers=admin)
        assert done.status_code == 200, done.text
        gone = httpx.post(f"{url}/v1/completions", json={"model": "late", "prompt": PROMPT}, timeout=30)
        assert gone.status_code == 200  # no adapters left: any model name is the base again
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=30,
                          headers=admin).status_code == 404
    finally:
        engine.shutdown()


def test_without_admin_keys_the_admin_routes_are_off(serve, async_engine):
    url = serve(async_engine, admin_key_env="TEST_NO_SUCH_VAR").url
    r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"}, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_routes_off"


def test_the_openai_client_picks_adapters_by_model(lora_server, tokenizer):
    served, base, adapters = lora_server
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["base", *adapters]
    texts = {name: client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text
             for name in ["base", *adapters]}
    assert texts == {name: tokenizer.decode(_merged_tokens(base, adapters.get(name), tokenizer)[0])
                     for name in texts}
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="typo", prompt=PROMPTS[0], max_tokens=2)


def test_bad_adapters_through_the_admin_route_are_400s_naming_why(serve, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_ADMIN_KEYS", "s3cret")
    base = tiny_gpt(tokenizer)
    engine = AsyncEngine(LLMEngine(copy.deepcopy(base), tokenizer, InferConfig(num_kv_blocks=64, max_loras=2,
                                                                               max_lora_rank=8)))
    try:
        url = serve(engine, admin_key_env="TEST_ADMIN_KEYS").url
        random_lora(base, TARGETS["all"], 1).save(tmp_path / "ok")
        random_lora(base, TARGETS["all"], 2, rank=16).save(tmp_path / "wide")
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "adapter_config.json").write_text("{not json")
        (tmp_path / "broken" / "adapter_model.safetensors").write_bytes(b"junk")
        cases = [("wide", "max_lora_rank is 8"), ("broken", "not a LoRA adapter config"), ("ok", None),
                 ("ok", None), ("ok", "max_loras is 2")]
        for i, (name, message) in enumerate(cases):
            r = httpx.post(f"{url}/v1/load_lora_adapter", timeout=30, headers={"authorization": "Bearer s3cret"},
                           json={"lora_name": f"{name}{i}", "lora_path": str(tmp_path / name)})
            if message is None:
                assert r.status_code == 200, r.text
            else:
                assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    finally:
        engine.shutdown()


def test_loading_and_unloading_under_traffic_fails_nothing_and_leaks_no_blocks(serve, tokenizer, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("TEST_ADMIN_KEYS", "s3cret")
    base = tiny_gpt(tokenizer)
    for name in ("steady", "churn"):
        random_lora(base, TARGETS["all"], len(name)).save(tmp_path / name)
    engine = AsyncEngine(LLMEngine(copy.deepcopy(base), tokenizer, InferConfig(max_num_seqs=8, num_kv_blocks=64)))
    admin = {"authorization": "Bearer s3cret"}
    try:
        served = serve(engine, model_name="base", admin_key_env="TEST_ADMIN_KEYS",
                       lora_modules=[f"steady={tmp_path / 'steady'}"])
        stop, results = threading.Event(), []

        def traffic(i: int) -> None:
            while not stop.is_set():
                r = httpx.post(f"{served.url}/v1/completions", timeout=60, json={
                    "model": ["base", "steady"][i % 2], "prompt": f"{PROMPT} {i}", "max_tokens": 6})
                results.append(r.status_code)

        threads = [threading.Thread(target=traffic, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        churned = 0
        for _ in range(10):  # an adapter nobody asks for comes and goes while the others run
            body = {"lora_name": "churn", "lora_path": str(tmp_path / "churn")}
            assert httpx.post(f"{served.url}/v1/load_lora_adapter", json=body, headers=admin,
                              timeout=30).status_code == 200
            r = httpx.post(f"{served.url}/v1/unload_lora_adapter", json={"lora_name": "churn"}, headers=admin,
                           timeout=30)
            churned += r.status_code == 200
        stop.set()
        for t in threads:
            t.join(60)
        assert churned == 10 and results and set(results) == {200}, set(results)
        stats = served.state.adapter.stats()
        assert stats.running == stats.waiting == stats.kv_bytes_in_use == 0  # every block given back
    finally:
        engine.shutdown()


def test_the_request_log_and_the_metrics_name_the_adapter_that_answered(serve, tokenizer, tmp_path):
    """The log line's `model`, and the `model` label of the token and cost counters (cost per adapter)."""

    base = tiny_gpt(tokenizer)
    random_lora(base, TARGETS["attn"], 3).save(tmp_path / "attn")
    engine = AsyncEngine(LLMEngine(copy.deepcopy(base), tokenizer, InferConfig(num_kv_blocks=64)))
    try:
        served = serve(engine, log=True, model_name="base", lora_modules=[f"attn={tmp_path / 'attn'}"])
        for model, rid in (("attn", "r-attn"), ("base", "r-base")):
            assert httpx.post(f"{served.url}/v1/completions", timeout=30, headers={"x-request-id": rid},
                              json={"model": model, "prompt": PROMPT, "max_tokens": 2,
                                    "ignore_eos": True}).status_code == 200
        served.log.close()
        rows = {row["request_id"]: row for row in map(json.loads, served.log_path.read_text().splitlines())}
        assert rows["r-attn"]["model"] == "attn" and rows["r-base"]["model"] == "base"
        m = scrape(served.url)
        for model in ("attn", "base"):
            assert total(m, "tinystack_generation_tokens_total", model=model) == 2
            assert total(m, "tinystack_request_device_seconds_total", model=model) > 0
    finally:
        engine.shutdown()


def test_echo_with_logprobs_scores_the_prompt_with_therandom_lora(lora_server, tokenizer):
    """lm-evaluation-harness' loglikelihood request (echo, logprobs) under an adapter: the prompt's logprobs are
    those of the adapter's merged model, not the base's."""
    from tinystack.eval.scoring import prompt_logprobs

    served, base, adapters = lora_server
    ids = tokenizer.encode(PROMPT)

    def echoed(name):
        r = httpx.post(f"{served.url}/v1/completions", timeout=30, json={
            "model": name, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 1})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["logprobs"]["token_logprobs"][:len(ids)]  # the prompt's, then one generated

    for name, adapter in adapters.items():
        want = [lp for lp, _ in prompt_logprobs(_merged(base, adapter), ids, 1)]
        got = echoed(name)
        assert got[0] is None and want[0] is None
        assert got[1:] == pytest.approx(want[1:], abs=1e-4), name
    assert echoed("base")[1:] != pytest.approx(echoed("attn")[1:], abs=1e-3)


def test_an_adapter_from_the_registry_is_served_and_each_promotion_loaded_while_serving(serve, tokenizer, tmp_path,
                                                                                        monkeypatch):
    """`--lora-modules legal=registry:legal` serves the registry's current adapter of that name and loads each
    later promotion without a restart; `registry:legal@v1` stays pinned; a registry model that is not an adapter,
    or a name the registry lacks, stops the start with one line."""
    from tinystack.serve import lora_modules

    monkeypatch.setattr(lora_modules, "FOLLOW_INTERVAL_S", 0.05)
    base = tiny_gpt(tokenizer)
    reg = ModelRegistry(tmp_path / "registry")
    gated = {"lineage": {"finetune": {"rejected": None, "heldout": {"delta": -0.5, "current": None}}}}
    made = {name: random_lora(base, TARGETS[name], seed) for name, seed in (("attn", 11), ("mlp", 12))}
    for name, adapter in made.items():
        adapter.save(tmp_path / name)
    reg.promote("legal", reg.add("legal", tmp_path / "attn", gated))
    want = {name: tokenizer.decode(_merged_tokens(base, made[name], tokenizer)[0]) for name in made}
    engine = AsyncEngine(LLMEngine(copy.deepcopy(base), tokenizer, InferConfig(num_kv_blocks=64,
                                                                               weight_format="float32")))
    try:
        served = serve(engine, model_name="base", lora_modules=["legal=registry:legal", "old=registry:legal@v1"],
                       registry=tmp_path / "registry")

        def ask(model):
            r = httpx.post(f"{served.url}/v1/completions", timeout=30, json={
                "model": model, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        assert ask("legal") == ask("old") == want["attn"]
        reg.promote("legal", reg.add("legal", tmp_path / "mlp", gated))
        assert wait_for(lambda: ask("legal") == want["mlp"], timeout=10)
        assert ask("old") == want["attn"]  # pinned
        assert sorted(served.state.adapter.lora_names()) == ["legal", "old"]
    finally:
        engine.shutdown()
    save_model(base, tmp_path / "full")
    reg.promote("full", reg.add("full", tmp_path / "full", {}))
    for spec, why in (("registry:full", "is a model, not a LoRA adapter"), ("registry:nope", "no promoted model")):
        with pytest.raises(ValueError, match=why):
            create_app(served.engine, ServeConfig(lora_modules=[f"x={spec}"]), registry=tmp_path / "registry")
