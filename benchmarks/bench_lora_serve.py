"""Many LoRA adapters from one engine (infer/lora.py) on SmolLM2-135M-Instruct: 16 concurrent requests spread over
1, 4 and 16 rank-8 adapters on every projection, against the same 16 on the base alone, in one engine and one run,
trials interleaved (median). Prints and writes aggregate output tokens/s, TPOT, and the bytes each adapter holds
(its stacked weights, against its file); and the alternative it replaces: the same requests answered by
separate merged models, one per adapter, on the same cores: with --processes N, N processes each holding the
base with one adapter merged in (in the weight format the engine chose), each answering one request, all at once
(aggregate output tokens/s from the first start to the last end); without it, one request alone in the engine (what
one such process gets at best).

    .venv/bin/python benchmarks/bench_lora_serve.py --model DIR [--trials 3] [--max-tokens 64] [--compare-paths]
                                                    [--processes 16]
    -> benchmarks/results/lora_serve.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench_common import RESULTS, finish, machine
from tinystack.infer import LLM, SamplingParams
from tinystack.model.lora_adapter import LoRAAdapter

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = [f"Write a short note about topic number {i}: the weather, a city, a meal." for i in range(16)]


def random_adapter(model: torch.nn.Module, rank: int, seed: int) -> LoRAAdapter:
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for path, m in model.named_modules():
        if path.rsplit(".", 1)[-1] in TARGETS and hasattr(m, "weight"):
            out_f, in_f = m.weight.shape
            weights[path] = (torch.randn(rank, in_f, generator=g) / in_f ** 0.5,
                             torch.randn(out_f, rank, generator=g) * 0.01)
    return LoRAAdapter(weights, rank, 2.0)


def run(llm: LLM, loras: list[str | None], max_tokens: int) -> dict[str, float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(PROMPTS, params, lora=loras)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    tpot = statistics.median(o.metrics.decode_s / max(1, len(o.token_ids) - 1) for o in outs)
    return {"tokens_per_s": tokens / wall, "tpot_ms": tpot * 1e3}


_PROCESS = """
import json, sys, time
from tinystack.infer import LLM, SamplingParams
from tinystack.infer.quant.linear import quantize_model
from tinystack.model.io import load_model
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.tokenizer import load_tokenizer
model_dir, adapter, fmt, n, prompt = sys.argv[1:]
model = LoRAAdapter.load(adapter).merge_into(load_model(model_dir))
if fmt != "float32":
    quantize_model(model, fmt)
llm = LLM(model, load_tokenizer(model_dir), weight_format="float32", max_num_seqs=1, memory_limit_mb=512)
llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0))
print("ready", flush=True)
sys.stdin.readline()
t0 = time.time()
out = llm.generate([prompt], SamplingParams(max_tokens=int(n), temperature=0, ignore_eos=True))[0]
print(json.dumps({"tokens": len(out.token_ids), "t0": t0, "t1": time.time(),
                  "tpot_s": out.metrics.decode_s / max(1, len(out.token_ids) - 1)}), flush=True)
"""


def merged_processes(model_dir: str, adapter_dirs: list[Path], fmt: str, max_tokens: int) -> dict[str, float]:
    """N processes, each the base with one adapter merged (what serving N fine-tunes without adapters takes),
    loaded first, then all asked one request at once: aggregate output tokens/s over the whole span."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _PROCESS, model_dir, str(a), fmt, str(max_tokens), PROMPTS[i]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i, a in enumerate(adapter_dirs)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:  # every process is loaded and warm: go
        p.stdin.write("go\n")
        p.stdin.flush()
    runs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    span = max(r["t1"] for r in runs) - min(r["t0"] for r in runs)
    return {"tokens_per_s": sum(r["tokens"] for r in runs) / span,
            "tpot_ms": statistics.median(r["tpot_s"] for r in runs) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--compare-paths", action="store_true", help="16 adapters: the fused step vs the model's "
                    "forward (padded batched products, or per adapter): what each path buys")
    ap.add_argument("--processes", type=int, default=0, help="also N merged-model processes, one request each")
    args = ap.parse_args()
    from tinystack.model.io import load_model

    plain = load_model(args.model)  # the unfused module names, as PEFT writes them
    adapters = [random_adapter(plain, args.rank, seed) for seed in range(16)]
    del plain
    llm = LLM(args.model, max_num_seqs=16, max_loras=16)  # the server's default weight format ("auto")
    with tempfile.TemporaryDirectory() as d:
        files = []
        for i, a in enumerate(adapters):
            a.save(Path(d) / f"a{i}")
            files.append(sum(f.stat().st_size for f in (Path(d) / f"a{i}").iterdir()))
            llm.engine.add_lora(f"a{i}", Path(d) / f"a{i}")
    stacks = {hit[0] for hit in llm.engine.loras.projections.values() if hit[0].stack is not None}
    resident = sum(t.nbytes for w in stacks for t in w.stack)  # every adapter's weights, held once (padded stacks)
    cases = {"base": [None] * 16, "1 adapter": ["a0"] * 16, "4 adapters": [f"a{i % 4}" for i in range(16)],
             "16 adapters": [f"a{i}" for i in range(16)], "single request (merged-model process bound)": None}
    run(llm, [None] * 16, 8)  # warm-up: kernels, KV pages
    run(llm, [f"a{i}" for i in range(16)], 8)
    trials: dict[str, list[dict[str, float]]] = {k: [] for k in cases}
    for t in range(args.trials):
        order = list(cases) if t % 2 == 0 else list(reversed(cases))
        for name in order:
            if cases[name] is None:  # one request alone: what one of N merged-model processes gets at best
                params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
                t0 = time.perf_counter()
                out = llm.generate(PROMPTS[:1], params)[0]
                trials[name].append({"tokens_per_s": len(out.token_ids) / (time.perf_counter() - t0),
                                     "tpot_ms": out.metrics.decode_s / max(1, len(out.token_ids) - 1) * 1e3})
            else:
                trials[name].append(run(llm, cases[name], args.max_tokens))
    if args.compare_paths:  # the same 16-adapter batch down the other paths, interleaved with the default one
        from tinystack.infer import lora
        from tinystack.infer.fused_step import FusedStep

        batched_step, fused_take = lora._Step.__init__, FusedStep.take_loras

        def per_group(self, slots, resident, device):
            batched_step(self, slots, resident, device)
            self.gather = None

        variants = {  # adapter steps through the model's forward (its padded batch; or per-group products)
            "16 adapters, model forward": [(FusedStep, "take_loras", lambda self, adapters: False)],
            "16 adapters, model forward, per-group products": [(FusedStep, "take_loras", lambda self, a: False),
                                                                (lora._Step, "__init__", per_group)]}
        for name in variants:
            trials[name] = []
        for _ in range(args.trials):
            for name, patches in variants.items():
                for owner, attr, fn in patches:
                    setattr(owner, attr, fn)
                trials[name].append(run(llm, cases["16 adapters"], args.max_tokens))
                lora._Step.__init__, FusedStep.take_loras = batched_step, fused_take
            trials["16 adapters"].append(run(llm, cases["16 adapters"], args.max_tokens))
    if args.processes:
        from tinystack.infer.quant.linear import QuantLinear

        # the weight format the engine chose ("auto"), for the merged models too
        fmt = next((m.packed.fmt for m in llm.engine.model.modules() if isinstance(m, QuantLinear)), "float32")
        with tempfile.TemporaryDirectory() as d:
            for i in range(args.processes):
                adapters[i % 16].save(Path(d) / f"a{i}")
            trials[f"{args.processes} merged-model processes"] = [
                merged_processes(args.model, [Path(d) / f"a{i}" for i in range(args.processes)], fmt, args.max_tokens)]
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("tokens_per_s", "tpot_ms")} for k, v in trials.items()}
    base = med["base"]["tokens_per_s"]
    res = {"model": args.model, "rank": args.rank, "max_tokens": args.max_tokens, "trials": args.trials,
           "median": med, "vs_base": {k: v["tokens_per_s"] / base for k, v in med.items()},
           "adapter_file_bytes": statistics.median(files),
           "resident_bytes_per_adapter": resident / 16, "machine": machine()}
    finish(res)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lora_serve.json").write_text(json.dumps(res, indent=2))
    print(json.dumps({k: res[k] for k in ("median", "vs_base", "adapter_file_bytes",
                                          "resident_bytes_per_adapter")}, indent=2))


if __name__ == "__main__":
    main()
