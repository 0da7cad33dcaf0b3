"""bench_structured's part 2: JSON Schema constrained generation on SmolLM2-135M-Instruct, end to end.

    (a) 16 concurrent chat requests asking for a JSON object matching SCHEMA, constrained (StructuredOutputs(json=
        SCHEMA), greedy, max_tokens=--new) vs the same requests unconstrained: greedy, ignore_eos, each request's
        max_tokens = the length of its constrained output in the warm-up run, so both sides produce the same
        number of tokens per request. Aggregate output tokens/s (wall), their ratio, TPOT p50/p99 (a request's
        decode seconds / (its tokens - 1)), and the share of outputs that finish and validate (jsonschema)
    (b) the same at batch 1 (4 of the prompts, one generate call each)
    (c) fast-forward on vs off (infer.structured_fast_forward) on FIXED, 10 required keys with const / enum /
        short values, as given (llguidance's flexible whitespace, the engine's default) and with the schema's
        "x-guidance": {"whitespace_flexible": false}: batch 1, wall seconds of one request to its complete object
        (prefill included)
    (d) llama.cpp (llama-cpp-python, the same GGUF, a grammar from the same schema) batch 1, constrained vs the
        same prompt unconstrained (EOS not a stop, same length): its ratio, where llama_cpp imports
    (e) the same as (a) through `tinystack serve` (bench_structured_http), where the server takes response_format
Trials interleaved (the order alternates), median. The engine is LLM over one loaded model (weight_format auto,
paged KV cache); the constrained path is what the engine does by default (fast-forward on).
"""
from __future__ import annotations

import json
import statistics
import time

from bench_structured_peers import http_bench, llama_cpp_peer, valid
from tinystack.infer import LLM, SamplingParams
from tinystack.infer.chat import chat_formatter, encode_chat
from tinystack.infer.loading import load_for_inference
from tinystack.sampling_params import StructuredOutputs

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                                                                               "maximum": 120},
                         "city": {"type": "string", "maxLength": 24},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}}}
PEOPLE = ["a pirate", "a baker", "a chess player", "an astronaut", "a gardener", "a violinist", "a detective",
          "a surfer", "a teacher", "a firefighter", "a painter", "a programmer", "a beekeeper", "a pilot",
          "a librarian", "a chef"]
_FIXED_PROPS = {"kind": {"const": "ticket"}, "version": {"const": 2}, "status": {"enum": ["open", "closed"]},
                "priority": {"enum": ["low", "medium", "high"]}, "team": {"enum": ["infrastructure", "website"]},
                "severity": {"type": "integer", "minimum": 1, "maximum": 4}, "public": {"type": "boolean"},
                "region": {"enum": ["europe", "america", "asia"]}, "channel": {"const": "email"},
                "title": {"type": "string", "maxLength": 24}}
FIXED = {"type": "object", "properties": _FIXED_PROPS, "required": list(_FIXED_PROPS), "additionalProperties": False}
# the same with llguidance's fixed separators (the schema's own option): no free whitespace between a key and its
# value, so every key, colon and const value is forced, not only the text after the model opens a key's quote
FIXED_COMPACT = {**FIXED, "x-guidance": {"whitespace_flexible": False}}
FIXED_ASK = "File a support ticket as JSON for this problem: {}."
PROBLEMS = ["the login page times out", "invoices show the wrong currency"]


def person_prompt(who: str) -> str:
    return f"Describe {who} as a JSON object with name, age, city and hobbies."


def chat_ids(model_dir, tok, text: str) -> list[int]:
    return encode_chat(tok, chat_formatter(model_dir, tok).render([{"role": "user", "content": text}]))


def _tpot(o) -> float | None:
    m, n = o.metrics, len(o.token_ids)
    return None if n < 2 or m.decode_s is None else m.decode_s / (n - 1)


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else None


def constrained_vs_free(llm: LLM, prompts: list[list[int]], new: int, trials: int, batch: int) -> dict:
    """(a) with batch = len(prompts), (b) with batch = 1: prompts in groups of `batch`, one generate call each."""
    so = SamplingParams(temperature=0, max_tokens=new, structured_outputs=StructuredOutputs(json=SCHEMA))
    groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]

    def run(params_of) -> tuple[float, list]:
        outs, t0 = [], time.perf_counter()
        for g in groups:
            outs += llm.generate(g, [params_of(i + len(outs)) for i in range(len(g))])
        return time.perf_counter() - t0, outs

    _, warm = run(lambda i: so)  # warm-up; its lengths are the unconstrained side's max_tokens
    lengths = [max(1, len(o.token_ids)) for o in warm]
    free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    runs = {"constrained": lambda i: so, "unconstrained": lambda i: free[i]}
    rec: dict[str, dict[str, list]] = {k: {"wall_s": [], "tokens": [], "tpot_s": []} for k in runs}
    last: dict[str, list] = {}
    for t in range(trials):
        for name in runs if t % 2 == 0 else list(runs)[::-1]:
            wall, outs = run(runs[name])
            rec[name]["wall_s"].append(wall)
            rec[name]["tokens"].append(sum(len(o.token_ids) for o in outs))
            rec[name]["tpot_s"] += [_tpot(o) for o in outs]
            last[name] = outs
        print(f"  batch {batch} trial {t + 1}/{trials}: " + ", ".join(
            f"{k} {v['tokens'][-1] / v['wall_s'][-1]:.1f} tok/s" for k, v in rec.items()), flush=True)
    res: dict = {"requests": len(prompts), "batch": batch, "max_tokens": new, "trials": trials,
                 "constrained_lengths": lengths}
    for name, r in rec.items():
        outs = last[name]
        res[name] = {"tokens_per_s": statistics.median(t / w for t, w in zip(r["tokens"], r["wall_s"])),
                     "tpot_ms_p50": _ms(_pct(r["tpot_s"], 50)), "tpot_ms_p99": _ms(_pct(r["tpot_s"], 99)),
                     "finished": sum(o.finish_reason == "stop" for o in outs),
                     "validate": sum(valid(o.text, SCHEMA) for o in outs), "wall_s": r["wall_s"],
                     "example": outs[0].text[:200]}
    res["validate_share_constrained"] = res["constrained"]["validate"] / len(prompts)
    res["tokens_per_s_ratio"] = res["constrained"]["tokens_per_s"] / res["unconstrained"]["tokens_per_s"]
    return res


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 2)


def fast_forward(model, tok, prompts: list[list[int]], new: int, trials: int, schema: dict) -> dict:
    """(c): one request at a time, the ticket prompts, engines with structured_fast_forward on and off."""
    so = SamplingParams(temperature=0, max_tokens=new, structured_outputs=StructuredOutputs(json=schema))
    llms = {"ff_on": LLM(model, tok, kv_cache="paged", max_num_seqs=1, structured_fast_forward=True),
            "ff_off": LLM(model, tok, kv_cache="paged", max_num_seqs=1, structured_fast_forward=False)}
    walls: dict[str, list[float]] = {k: [] for k in llms}
    texts: dict[str, list[str]] = {k: [] for k in llms}
    for llm in llms.values():
        llm.generate(prompts[:1], so)  # warm-up
    for t in range(trials):
        for name in llms if t % 2 == 0 else list(llms)[::-1]:
            for p in prompts:
                t0 = time.perf_counter()
                out = llms[name].generate([p], so)[0]
                walls[name].append(time.perf_counter() - t0)
                texts[name].append(out.text)
    med = {k: statistics.median(v) for k, v in walls.items()}
    res = {"prompts": len(prompts), "trials": trials, "median_s": med, "walls_s": walls,
           "cut": 1 - med["ff_on"] / med["ff_off"], "target_cut": 0.30,
           "same_text": texts["ff_on"] == texts["ff_off"],
           "validate": {k: sum(valid(x, FIXED) for x in v) / len(v) for k, v in texts.items()},
           "output_tokens": len(tok.encode_plain(texts["ff_on"][0])),
           "example": texts["ff_on"][0][:300]}
    label = "fast-forward (compact)" if "x-guidance" in schema else "fast-forward"
    print(f"  {label}: on {med['ff_on'] * 1e3:.0f} ms, off {med['ff_off'] * 1e3:.0f} ms per object, "
          f"cut {res['cut']:.0%} (target >= 30%)", flush=True)
    return res


def part2(model_dir, tok, trials: int, new: int, http: bool = True) -> dict:
    model, _ = load_for_inference(model_dir, tokenizer=tok)  # weight_format "auto": prints its choice
    prompts = [chat_ids(model_dir, tok, person_prompt(w)) for w in PEOPLE]
    llm16 = LLM(model, tok, kv_cache="paged", max_num_seqs=16)
    res = {"schema": SCHEMA, "fixed_schema": FIXED, "new": new}
    res["concurrent16"] = constrained_vs_free(llm16, prompts, new, trials, batch=16)
    res["batch1"] = constrained_vs_free(llm16, prompts[:4], new, trials, batch=1)
    ff_prompts = [chat_ids(model_dir, tok, FIXED_ASK.format(p)) for p in PROBLEMS]
    res["fast_forward"] = fast_forward(model, tok, ff_prompts, new, trials, FIXED)
    res["fast_forward_compact"] = fast_forward(model, tok, ff_prompts, new, trials, FIXED_COMPACT)
    res["llama_cpp"] = llama_cpp_peer(prompts[:4], new, trials, SCHEMA)
    res["http"] = http_bench(model_dir, PEOPLE, person_prompt, SCHEMA, new) if http else {"status": "skipped"}
    return res


def print_part2(res: dict) -> None:
    print("\nend to end (SmolLM2-135M-Instruct)      constrained  unconstrained  ratio  TPOT p50/p99 (ms)  valid")
    for key in ("concurrent16", "batch1"):
        r = res[key]
        c, u = r["constrained"], r["unconstrained"]
        print(f"  {key:36s} {c['tokens_per_s']:9.1f} {u['tokens_per_s']:12.1f} {r['tokens_per_s_ratio']:8.2f}"
              f"   {c['tpot_ms_p50']}/{c['tpot_ms_p99']} vs {u['tpot_ms_p50']}/{u['tpot_ms_p99']}"
              f"   {c['validate']}/{r['requests']}")
    for key in ("fast_forward", "fast_forward_compact"):
        ff = res[key]
        print(f"  {key}: on {ff['median_s']['ff_on']:.2f} s, off {ff['median_s']['ff_off']:.2f} s per object, "
              f"cut {ff['cut']:.0%} (target >= 30%), same text: {ff['same_text']}, valid {ff['validate']}")
    for key in ("llama_cpp", "http"):
        print(f"  {key}: " + json.dumps({k: v for k, v in res[key].items() if k not in ("request", "example")})[:300])
