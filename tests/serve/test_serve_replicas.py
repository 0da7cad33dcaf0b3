"""Two engine replicas on a local Ray cluster (Ray Serve) behind the gateway (serve/replicas).

One cluster for the module (starting Ray and two replicas is most of the time): the API through the
gateway, streaming, the replica header, /health and /metrics per replica, a rate limit that holds
across replicas, a LoRA adapter of [serve] lora_modules served by every replica, failover (a replica killed
under load: only 200 / 429 / 503, streams end with [DONE], the count returns to 2), and a rolling update to
another model under load.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import ExitStack
from dataclasses import replace

import httpx
import pytest
import torch
from serve_helpers import random_lora, tiny_gpt

from tinystack.config import Config
from tinystack.infer import LLM
from tinystack.model.io import load_model, save_model
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.sampling_params import SamplingParams
from tinystack.serve import create_app, run_in_background

ray = pytest.importorskip("ray", reason="the [dist] extra (ray[serve]) is part of the dev setup")
from tinystack.serve.replicas import deploy  # noqa: E402

pytestmark = pytest.mark.slow
OK_UNDER_FAULTS = {200, 429, 503}


def _config() -> Config:
    cfg = Config()
    cfg.serve.replicas, cfg.serve.replica_num_cpus, cfg.serve.routing = 2, 1.0, "prefix"
    cfg.serve.shutdown_grace_s = 10.0
    cfg.infer.max_num_seqs, cfg.infer.memory_limit_mb = 4, 64
    cfg.infer.weight_format, cfg.infer.hugepages = "float32", False  # no format measurement: replicas start fast
    return cfg


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tokenizer):
    """(config, [first model dir, second model dir], handle, gateway url, limited gateway url, small gateway
    url, the gateway's engine adapter). The limited gateway allows 5 requests/min per key; the small one queues
    nothing beyond what the replicas run (its admission gate: 2 replicas x 4 sequences)."""
    dirs = []
    for seed in (0, 1):
        path = tmp_path_factory.mktemp(f"model{seed}")
        model = tiny_gpt(tokenizer)
        if seed:
            torch.manual_seed(seed)
            model = type(model)(model.config)
        save_model(model, path, eos_token_id=tokenizer.eos_token_id)
        tokenizer.save(path)
        dirs.append(path)
    cfg = _config()
    random_lora(tiny_gpt(tokenizer), ("c_attn", "c_fc"), seed=5).save(lora := tmp_path_factory.mktemp("legal"))
    cfg.serve.lora_modules = [f"legal={lora}"]  # each replica loads it at its start
    started = deploy.connect("", 2, 1.0)
    with ExitStack() as stack:
        stack.callback(deploy.shutdown, started)
        handle = deploy.deploy(dirs[0], cfg)
        adapter = deploy.gateway_adapter(handle, dirs[0], cfg)
        url = stack.enter_context(run_in_background(create_app(adapter, cfg.serve, model_dir=dirs[0]),
                                                    startup_timeout_s=30))
        limited = replace(cfg.serve, rate_limit_rpm=5)
        limited_url = stack.enter_context(run_in_background(create_app(adapter, limited, model_dir=dirs[0]),
                                                            startup_timeout_s=30))
        small = replace(cfg.serve, max_queued_requests=0)
        small_url = stack.enter_context(run_in_background(create_app(adapter, small, model_dir=dirs[0]),
                                                          startup_timeout_s=30))
        _wait_for_replicas(url, 2, 60)
        yield cfg, dirs, handle, url, limited_url, small_url, adapter


# Seconds a replica may take to be replaced or rolled: ~10-40 s on an idle 2-core machine, several times that
# while `make test`'s other worker runs a CPU-bound test beside the cluster; only a replica that never comes
# back fails this.
REPLACE_S = 240


def _wait_for_replicas(url: str, n: int, timeout_s: float, gone: str | None = None) -> float:
    """Seconds until /health says `n` replicas up and /metrics lists `n` replicas, `gone` (a killed one) not among
    them: Serve lists a killed replica until its controller has seen the death, and a new replica can be up a
    moment before its metrics are."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        body = httpx.get(url + "/health", timeout=10).json()
        if body.get("replicas_up") == n:
            ids = _replica_ids(url)
            if len(ids) == n and gone not in ids:
                return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"replicas up did not return to {n} within {timeout_s} s: {body}")


def _complete(url: str, i: int, stream: bool = False, max_tokens: int = 8) -> tuple[int, str | None, bool]:
    """(status, replica header, stream ended properly: whole events, then [DONE] -- or True for a whole answer)."""
    body = {"prompt": f"return the number of items {i}", "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        if not (stream and r.status_code == 200):
            r.read()
            return r.status_code, r.headers.get("x-tinystack-replica"), True
        lines = [line for line in r.iter_lines() if line]
        return r.status_code, r.headers.get("x-tinystack-replica"), _whole_events(lines) is not None


def _whole_events(lines: list[str]) -> list[dict] | None:
    """The events of a stream's lines when each is a whole JSON event and the last is [DONE]; else None."""
    if not lines or lines[-1] != "data: [DONE]":
        return None
    try:
        return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    except ValueError:  # an event cut mid-line
        return None


def _replica_ids(url: str) -> set[str]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("tinystack_num_requests_running{replica=")}


def test_the_api_through_two_replicas(cluster):
    cfg, dirs, handle, url, *_ = cluster
    replicas = _replica_ids(url)
    assert len(replicas) == 2
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["replicas_up"] == 2 and health["replicas_total"] == 2
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    assert r.headers["x-tinystack-replica"] in replicas
    r = httpx.post(url + "/generate", json={"prompt": "return the", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["completion_tokens"] == 4 or r.json()["finish_reason"] == "stop"
    assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == 64
    # validation happens once, at the gateway, in the OpenAI error shape
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    # concurrent requests spread over both replicas (least loaded); streams end with [DONE]
    with ThreadPool(8) as pool:
        results = pool.map(lambda i: _complete(url, i, stream=i % 2 == 0, max_tokens=16), range(16))
    assert all(status == 200 and done for status, _, done in results)
    assert {replica for _, replica, _ in results} == replicas
    # each replica's engine metrics, labelled
    text = httpx.get(url + "/metrics").text
    ended = [line for line in text.splitlines() if line.startswith("tinystack_prefix_cache_queries_total{replica=")]
    assert len(ended) == 2


def test_embeddings_and_echoed_prompt_logprobs_through_the_replicas(cluster):
    # computed on a replica's engine thread (EngineReplica.embed / prompt_logprobs): the same numbers every time,
    # whichever replica answers (both serve the same model)
    url = cluster[3]
    first = httpx.post(url + "/v1/embeddings", json={"input": ["return the", "hi"]}, timeout=60)
    assert first.status_code == 200, first.text
    vectors = [d["embedding"] for d in first.json()["data"]]
    assert len(vectors) == 2 and all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vectors)
    body = {"prompt": ["return the", "hi there"], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    echoed = [httpx.post(url + "/v1/completions", json=body, timeout=60) for _ in range(3)]
    assert all(r.status_code == 200 for r in echoed), [r.text for r in echoed]
    scores = [[c["logprobs"]["token_logprobs"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
              for r in echoed]
    assert scores[0][0][0] is None and all(lp is not None for lp in scores[0][0][1:])
    assert all(s == scores[0] for s in scores)


def test_a_lora_adapter_of_lora_modules_is_served_by_every_replica(cluster, tokenizer):
    """The adapter's answers through the gateway, from both replicas, equal its merged model's, token for token;
    loading another at run time is refused (a replica Serve starts later would not have it)."""
    cfg, dirs, _, url, *_ = cluster
    assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]][1:] == ["legal"]
    adapter = LoRAAdapter.load(cfg.serve.lora_modules[0].split("=", 1)[1])
    merged = load_model(dirs[0])
    with torch.no_grad():
        for path, (a, b) in adapter.weights.items():
            merged.get_submodule(path).weight += adapter.scale * b @ a
    prompts = [f"return the number of items {i}" for i in range(16)]
    want = [o.text for o in LLM(merged, tokenizer, weight_format="float32", memory_limit_mb=64).generate(
        prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))]

    def ask(i):
        r = httpx.post(url + "/v1/completions", timeout=60, json={
            "model": "legal", "prompt": prompts[i], "max_tokens": 6, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["model"] == "legal", r.text
        return r.json()["choices"][0]["text"], r.headers["x-tinystack-replica"]

    with ThreadPool(8) as pool:  # at once: both replicas answer some
        got = pool.map(ask, range(16))
    assert [text for text, _ in got] == want
    assert {replica for _, replica in got} == _replica_ids(url)
    base = httpx.post(url + "/v1/completions", timeout=60, json={"prompt": prompts[0], "max_tokens": 6,
                                                                 "temperature": 0, "ignore_eos": True})
    assert base.json()["choices"][0]["text"] != want[0]  # the adapter changes the answer
    with pytest.raises(NotImplementedError, match="at start only"):  # what /v1/load_lora_adapter answers 400 with
        asyncio.run(cluster[6].add_lora("other", str(dirs[0])))


def test_a_rate_limit_holds_across_replicas(cluster):
    limited_url = cluster[4]
    results = [_complete(limited_url, i) for i in range(5)]
    assert [s for s, _, _ in results] == [200] * 5
    r = httpx.post(limited_url + "/v1/completions", json={"prompt": "one more", "max_tokens": 2}, timeout=60)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


def _load(url: str, stop: threading.Event, out: list, clients: int = 4) -> list[threading.Thread]:
    def client(c: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                out.append(_complete(url, c * 10_000 + i, stream=i % 2 == 1, max_tokens=24))
            except httpx.HTTPError as e:  # a transport error is a failure too: recorded, the test fails
                out.append((type(e).__name__, None, False))
            i += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    return threads


def test_a_killed_replica_is_replaced_and_nothing_but_200_429_503_is_seen(cluster):
    cfg, dirs, handle, url, *_ = cluster
    stop, results = threading.Event(), []
    threads = _load(url, stop, results)
    time.sleep(2.0)
    victim = sorted(_replica_ids(url))[0]
    actor = ray.get_actor(f"SERVE_REPLICA::{deploy.APP_NAME}#{deploy.DEPLOYMENT}#{victim}", namespace="serve")
    ray.kill(actor, no_restart=True)
    before = len(results)
    time.sleep(1.0)
    replaced_in = _wait_for_replicas(url, 2, REPLACE_S, gone=victim)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(60)
    assert {s for s, _, _ in results} <= OK_UNDER_FAULTS, {s for s, _, _ in results}
    assert all(done for s, _, done in results if s == 200)  # a cut stream still ends: error event, [DONE]
    assert sum(s == 200 for s, _, _ in results[before:]) > 0  # the other replica kept serving
    assert victim not in _replica_ids(url) and len(_replica_ids(url)) == 2
    print(f"replica replaced in {replaced_in:.1f} s; {len(results)} requests: "
          f"{ {s: sum(x == s for x, _, _ in results) for s in OK_UNDER_FAULTS} }")


def test_a_stream_cut_by_its_replica_dying_ends_with_a_whole_error_event_and_done(cluster):
    """Kill the replica serving a stream right after its first token: the client still reads whole events, the
    last an error event, then [DONE]. The kill races the stream's end (a tiny model is fast), so up to 4 tries,
    each against a loaded replica; every try must end properly, and at least one must be cut."""
    url = cluster[3]
    cut = 0
    for _ in range(4):
        _wait_for_replicas(url, 2, REPLACE_S)
        with ThreadPool(4) as pool:  # keep the engines busy so the stream outlives the kill
            pool.pool.map(lambda i: _complete(url, i, stream=True, max_tokens=40), range(4))
            body = {"prompt": "return the", "max_tokens": 56, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                victim = r.headers["x-tinystack-replica"]
                lines = r.iter_lines()
                first = next(line for line in lines if line)
                ray.kill(ray.get_actor(f"SERVE_REPLICA::{deploy.APP_NAME}#{deploy.DEPLOYMENT}#{victim}",
                                       namespace="serve"), no_restart=True)
                rest = [line for line in lines if line]
        events = _whole_events([first, *rest])
        assert events is not None, [first, *rest]
        if "error" in events[-1]:
            assert events[-1]["error"]["code"] and len(events) >= 2  # tokens, then the error
            cut += 1
            break
        _wait_for_replicas(url, 2, REPLACE_S, gone=victim)
    assert cut == 1
    _wait_for_replicas(url, 2, REPLACE_S, gone=victim)


def test_a_rolling_update_fails_no_in_flight_request(cluster):
    cfg, dirs, handle, url, *_ = cluster
    old = _replica_ids(url)
    stop, results = threading.Event(), []
    threads = _load(url, stop, results)
    time.sleep(1.0)
    deploy.deploy(dirs[1], cfg)  # what `tinystack serve --model NEW --replicas 2 --ray-cluster auto` does
    deadline = time.monotonic() + REPLACE_S
    while time.monotonic() < deadline and (_replica_ids(url) & old or len(_replica_ids(url)) != 2):
        time.sleep(0.5)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(60)
    new = _replica_ids(url)
    assert len(new) == 2 and not new & old
    assert {s for s, _, _ in results} <= {200, 429}, {s for s, _, _ in results}  # no 5xx: nothing failed
    assert all(done for _, _, done in results)
    assert sum(s == 200 for s, _, _ in results) > len(results) // 2
    info = handle.info.remote().result(timeout_s=30)
    assert info["model_dir"] == str(dirs[1])


def test_prefix_routing_keeps_a_shared_prompt_on_one_replica(cluster):
    """4 system prompts of ~50 tokens (3 full KV blocks of 16): after the first request of each (spread by
    load), every later request with the same system prompt goes to the replica whose prefix cache holds it."""
    url = cluster[3]
    systems = [f"system {k}: " + " ".join(["return the number of items in the list"] * 2) for k in range(4)]
    ask = lambda k, i: httpx.post(url + "/v1/completions", json={"prompt": f"{systems[k]} q{i}", "max_tokens": 2},
                                  timeout=60).headers["x-tinystack-replica"]
    with ThreadPool(4) as pool:
        first = pool.map(lambda k: ask(k, 0), range(4))
    later = [[ask(k, i) for i in range(1, 4)] for k in range(4)]
    for k in range(4):
        assert set(later[k]) == {first[k]}, (k, first[k], later[k])
    time.sleep(1.5)  # the replicas' counters come with their routing stats (every 0.5 s)
    text = httpx.get(url + "/metrics").text
    hits = sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tinystack_prefix_cache_hits_total{replica="))
    assert hits >= 12 * 16  # each of the 12 later requests found at least its first block


def test_when_every_replica_is_full_the_gateway_answers_429_at_once(cluster):
    small_url = cluster[5]
    t0 = time.monotonic()
    with ThreadPool(24) as pool:
        results = pool.map(lambda i: httpx.post(small_url + "/v1/completions", timeout=60, json={
            "prompt": f"return {i}", "max_tokens": 48, "ignore_eos": True}), range(24))
    statuses = [r.status_code for r in results]
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 8 and statuses.count(429) >= 1
    assert all(r.headers.get("retry-after") == "1" for r in results if r.status_code == 429)
    assert time.monotonic() - t0 < 60  # nothing waited unbounded


class ThreadPool:
    """A small map over threads (httpx clients block)."""

    def __init__(self, n: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(n)

    def __enter__(self) -> ThreadPool:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown()

    def map(self, fn, items) -> list:
        return list(self.pool.map(fn, items))


def test_request_logs_carry_the_replica(cluster, tmp_path):
    cfg, dirs, handle, url, *_ = cluster
    from tinystack.observe import setup_request_log

    log_path = tmp_path / "requests.jsonl"
    log = setup_request_log(log_path)
    adapter = deploy.gateway_adapter(handle, dirs[1], cfg)
    with run_in_background(create_app(adapter, cfg.serve, log, model_dir=dirs[1]), startup_timeout_s=30) as u:
        status, replica, _ = _complete(u, 1)
    log.close()
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    row = next(r for r in rows if r.get("path") == "/v1/completions")
    assert status == 200 and row["replica"] == replica
