"""bench_structured's peers: llama.cpp's constrained/unconstrained ratio; the same requests via `tinystack serve`.

    llama_cpp_peer  llama-cpp-python on the packaged GGUF (n_threads = all cores), batch 1, the same chat prompt ids:
                    constrained = a LlamaGrammar from the JSON Schema (built per request, as a server would), greedy,
                    to EOS; unconstrained = the same prompt, EOS not a stop, cut at the constrained length. Skipped
                    with a message where llama_cpp does not import (it builds from source: the `bench` extra)
    http_bench      `python -m tinystack serve` on the model (its own process, 127.0.0.1), 16 concurrent chat
                    completions with response_format json_schema vs the same unconstrained (ignore_eos, max_tokens =
                    each constrained answer's completion_tokens); aggregate completion tokens/s and the share that
                    validates. A server that refuses response_format is reported as pending, with the request shape
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema


def valid(text: str, schema: dict) -> bool:
    """The text parses as JSON and validates against the schema (jsonschema)."""
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def llama_cpp_peer(prompts: list[list[int]], new: int, trials: int, schema: dict) -> dict:
    try:
        import llama_cpp
    except ImportError:
        msg = "llama_cpp is not importable (pip install -e '.[bench]': llama-cpp-python builds from source)"
        print(f"  llama.cpp peer skipped: {msg}", flush=True)
        return {"status": f"skipped: {msg}"}
    from tinystack.model.importer import resolve_source

    gguf, _ = resolve_source("smollm2-135m-instruct")
    llm = llama_cpp.Llama(model_path=str(gguf), n_threads=os.cpu_count(), n_ctx=2048, verbose=False)
    eos = llm.token_eos()

    def gen(ids: list[int], limit: int, constrained: bool) -> list[int]:
        grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False) if constrained else None
        llm.reset()
        out: list[int] = []
        for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True, grammar=grammar):
            if constrained and tok == eos:
                break
            out.append(tok)
            if len(out) == limit:
                break
        return out

    lengths = [max(1, len(gen(p, new, True))) for p in prompts]  # warm-up; the unconstrained side's lengths
    walls: dict[str, list[float]] = {"constrained": [], "unconstrained": []}
    tokens = {k: 0 for k in walls}
    texts = []
    for t in range(trials):
        for name in walls if t % 2 == 0 else list(walls)[::-1]:
            t0 = time.perf_counter()
            outs = [gen(p, n if name == "unconstrained" else new, name == "constrained")
                    for p, n in zip(prompts, lengths)]
            walls[name].append(time.perf_counter() - t0)
            tokens[name] = sum(map(len, outs))
            if name == "constrained":
                texts = [llm.detokenize(o).decode("utf-8", "replace") for o in outs]
    tps = {k: tokens[k] / statistics.median(v) for k, v in walls.items()}
    return {"status": "ran", "requests": len(prompts), "tokens_per_s": tps, "walls_s": walls,
            "tokens_per_s_ratio": tps["constrained"] / tps["unconstrained"],
            "validate": sum(valid(x, schema) for x in texts), "example": texts[0][:200]}


def _post(url: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(base: str, proc: subprocess.Popen, limit_s: float = 420) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tinystack serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("tinystack serve was not ready in time")


def http_bench(model_dir, people: list[str], prompt_of, schema: dict, new: int, trials: int = 2) -> dict:
    """The server side by side with itself (constrained vs not); a server that fails to start or answer is a
    status line with the tail of its log, never an exception that loses the other parts' figures."""
    with tempfile.TemporaryFile("w+") as log:
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "tinystack", "serve", "--model", str(model_dir), "--port",
                                 str(port), "--log-level", "warning", "--set", "infer.max_num_seqs=16"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            return _http_runs(f"http://127.0.0.1:{port}", proc, people, prompt_of, schema, new, trials)
        except (RuntimeError, OSError, KeyError, ValueError) as e:
            log.seek(0)
            return {"status": f"failed: {e}", "server_log_tail": log.read()[-1500:]}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _http_runs(base: str, proc, people: list[str], prompt_of, schema: dict, new: int, trials: int) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    def body(who: str, **extra) -> dict:
        return {"model": "x", "messages": [{"role": "user", "content": prompt_of(who)}], "temperature": 0,
                "max_tokens": new, **extra}

    _wait_ready(base, proc)
    code, answer = _post(base + "/v1/chat/completions", body(people[0], response_format=fmt, max_tokens=8))
    if code != 200:
        return {"status": f"pending: the server refuses response_format json_schema (HTTP {code})",
                "answer": json.dumps(answer)[:300], "request": body(people[0], response_format=fmt)}
    url = base + "/v1/chat/completions"
    with ThreadPoolExecutor(len(people)) as pool:
        def burst(bodies: list[dict]) -> tuple[float, list[dict]]:
            t0 = time.perf_counter()
            outs = [a for _, a in pool.map(lambda b: _post(url, b), bodies)]
            return time.perf_counter() - t0, outs

        _, warm = burst([body(w, response_format=fmt) for w in people])
        lengths = [max(1, a["usage"]["completion_tokens"]) for a in warm]
        runs = {"constrained": [body(w, response_format=fmt) for w in people],
                "unconstrained": [body(w, max_tokens=n, ignore_eos=True) for w, n in zip(people, lengths)]}
        rec: dict[str, list[float]] = {k: [] for k in runs}
        last: dict[str, list[dict]] = {}
        for t in range(trials):
            for name in runs if t % 2 == 0 else list(runs)[::-1]:
                wall, outs = burst(runs[name])
                rec[name].append(sum(a["usage"]["completion_tokens"] for a in outs) / wall)
                last[name] = outs
    texts = [a["choices"][0]["message"]["content"] for a in last["constrained"]]
    tps = {k: statistics.median(v) for k, v in rec.items()}
    return {"status": "ran", "requests": len(people), "tokens_per_s": tps, "trials": trials,
            "tokens_per_s_ratio": tps["constrained"] / tps["unconstrained"],
            "validate": sum(valid(x, schema) for x in texts), "example": texts[0][:200]}
