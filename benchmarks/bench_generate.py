"""Our engine against `transformers.generate`, same weights, same run (GPT-2-124M shape, random, float32).

1. batch 1: 128 new tokens after a 128-token prompt, greedy, ignore EOS: tokens/s of each
   (trials interleaved, median), and the same tokens from both; our engine also with its
   weights in ordinary 4 KiB pages, to show what the 2 MiB-page arena is worth.
2. a workload of N requests (default 64) whose prompt and output lengths are drawn from
   16-512: output tokens per CPU-second of
     transformers.generate in padded batches of 16 (left-padded, run to the batch's longest output),
     our dynamic batcher (batches of 16, batch runs to completion),
     our continuous batching (paged cache, chunked prefill).
Times are this process's CPU seconds (one torch thread; see bench_common.timed: the
machine is shared), wall seconds recorded alongside. Writes benchmarks/results/generate.json.

    .venv/bin/python benchmarks/bench_generate.py [--threads 1] [--trials 3] [--requests 64] [--max-len 512]
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine, timed  # noqa: E402
from bench_infer_common import IdTokenizer, gpt2_124m, random_prompt  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402
from tinystack.infer import LLM, SamplingParams  # noqa: E402


@torch.inference_mode()
def hf_generate(hf, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Left-padded batch through transformers.generate, exactly new_tokens each (greedy, no EOS stop)."""
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                      do_sample=False, pad_token_id=0)
    return out[:, width:].tolist()


def batch1(ours, hf, trials: int) -> dict:
    """Trials interleave three systems in a shuffled order, so the neighbours' load hits all alike:
    our engine, our engine with its weights and cache in ordinary 4 KiB pages (hugepages=False: what
    the 2 MiB-page arena is worth), and transformers.generate. The speed-up is the median over trials
    of each trial's ratio (robust to a slow minute), with the ratio of the medians alongside."""
    prompt = random_prompt(128, seed=1)
    plain = copy.deepcopy(ours)  # before the engine moves `ours` into its arena
    kw = dict(kv_cache="contiguous", max_num_seqs=1, max_num_batched_tokens=128)
    engines = {"ours": LLM(ours, IdTokenizer(), **kw),
               "ours_4k_pages": LLM(plain, IdTokenizer(), hugepages=False, **kw)}
    greedy = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    runs = {name: (lambda llm=llm: llm.generate([prompt], greedy)[0].token_ids) for name, llm in engines.items()}
    runs["transformers"] = lambda: hf_generate(hf, [prompt], 128)[0]
    for llm in engines.values():  # warm-up
        llm.generate([prompt[:16]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    hf_generate(hf, [prompt[:16]], 4)
    times: dict[str, list[float]] = {k: [] for k in runs}
    walls: dict[str, list[float]] = {k: [] for k in runs}
    outs: dict[str, list[int]] = {}
    order = random.Random(0)
    for t in range(trials):
        for name in order.sample(list(runs), len(runs)):
            run = timed(runs[name])
            dt, outs[name] = run.cpu_s, run.value
            times[name].append(dt)
            walls[name].append(run.wall_s)
        print(f"  trial {t + 1}/{trials}: " + ", ".join(f"{k} {128 / v[-1]:.2f} tok/s" for k, v in times.items()),
              flush=True)
    tps = {k: 128 / statistics.median(v) for k, v in times.items()}
    per_trial = [h / o for h, o in zip(times["transformers"], times["ours"])]
    return {"prompt_tokens": 128, "new_tokens": 128, "trials": trials,
            "ours_tokens_per_s": tps["ours"], "ours_4k_pages_tokens_per_s": tps["ours_4k_pages"],
            "transformers_tokens_per_s": tps["transformers"],
            "speedup": statistics.median(per_trial), "speedup_per_trial": per_trial,
            "speedup_of_medians": tps["ours"] / tps["transformers"],
            "speedup_4k_pages": statistics.median(h / o for h, o in zip(times["transformers"], times["ours_4k_pages"])),
            "same_tokens": outs["ours"] == outs["transformers"] == outs["ours_4k_pages"],
            "cpu_s": times, "wall_s": walls}


def workload(ours, hf, n: int, lo: int, hi: int, seed: int = 0, skip_hf: bool = False) -> dict:
    rng = random.Random(seed)
    reqs = [(random_prompt(rng.randint(lo, hi), seed=1000 + i), rng.randint(lo, hi)) for i in range(n)]
    useful = sum(m for _, m in reqs)
    res = {"requests": n, "lengths": [lo, hi], "output_tokens": useful,
           "prompt_tokens": sum(len(p) for p, _ in reqs)}

    def ours_run(**kw):
        llm = LLM(ours, IdTokenizer(), **kw)
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in reqs]
        run = timed(lambda: llm.generate([p for p, _ in reqs], params))
        dt, outs = run.cpu_s, run.value
        assert [len(o.token_ids) for o in outs] == [m for _, m in reqs]
        return dt, outs, llm

    def hf_run():
        outs = []
        for b in range(0, n, 16):
            chunk = reqs[b:b + 16]
            gen = hf_generate(hf, [p for p, _ in chunk], max(m for _, m in chunk))
            outs += [g[:m] for g, (_, m) in zip(gen, chunk)]
        return outs

    hf_outs = None
    if not skip_hf:
        run = timed(hf_run)
        dt, hf_outs = run.cpu_s, run.value
        res["transformers_padded16"] = {"s": dt, "wall_s": run.wall_s, "tokens_per_s": useful / dt}
        print(f"transformers.generate, padded batches of 16: {dt:.1f} CPU s ({run.wall_s:.1f} wall)", flush=True)
    dt, dyn, _ = ours_run(scheduler="dynamic", max_num_seqs=16, kv_cache="paged", max_num_batched_tokens=8192)
    res["ours_dynamic16"] = {"s": dt, "wall_s": run.wall_s, "tokens_per_s": useful / dt}
    print(f"ours, dynamic batcher of 16: {dt:.1f} CPU s ({run.wall_s:.1f} wall)", flush=True)
    dt, cont, llm = ours_run(scheduler="continuous", kv_cache="paged", max_num_seqs=64, max_num_batched_tokens=512)
    res["ours_continuous"] = {"s": dt, "wall_s": run.wall_s, "tokens_per_s": useful / dt,
                              "preemptions": llm.engine.scheduler.num_preemptions,
                              "kv_blocks": llm.engine.budget.num_blocks}
    print(f"ours, continuous batching: {dt:.1f} CPU s ({run.wall_s:.1f} wall)", flush=True)
    res["continuous_vs_dynamic"] = res["ours_dynamic16"]["s"] / res["ours_continuous"]["s"]
    if hf_outs is not None:
        res["continuous_vs_transformers"] = res["transformers_padded16"]["s"] / res["ours_continuous"]["s"]
        # greedy outputs agree token for token except where float reassociation flips a near-tie
        agree = [sum(a == b for a, b in zip(o.token_ids, r)) / len(r) for o, r in zip(cont, hf_outs)]
        res["token_agreement_with_transformers"] = statistics.mean(agree)
    res["token_agreement_dynamic_vs_continuous"] = statistics.mean(
        sum(a == b for a, b in zip(x.token_ids, y.token_ids)) / len(y.token_ids) for x, y in zip(dyn, cont))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared; see docs)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--skip-workload", action="store_true")
    ap.add_argument("--skip-batch1", action="store_true")
    ap.add_argument("--skip-transformers", action="store_true", help="workload: our two schedulers only")
    ap.add_argument("--out", type=Path, default=RESULTS / "generate.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ours, hf = gpt2_124m()
    res = {"model": "GPT-2-124M shape, random weights, float32", "machine": machine()}
    if not args.skip_batch1:
        res["batch1"] = b1 = batch1(ours, hf, args.trials)
        print(f"batch 1, 128 after 128: ours {b1['ours_tokens_per_s']:.2f} tok/s (4 KiB pages "
              f"{b1['ours_4k_pages_tokens_per_s']:.2f}), transformers {b1['transformers_tokens_per_s']:.2f} tok/s -> "
              f"{b1['speedup']:.2f}x (median of per-trial ratios; {min(b1['speedup_per_trial']):.2f}-"
              f"{max(b1['speedup_per_trial']):.2f}; with 4 KiB pages {b1['speedup_4k_pages']:.2f}x; "
              f"same tokens: {b1['same_tokens']})", flush=True)
    if not args.skip_workload:
        res["workload"] = w = workload(ours, hf, args.requests, args.min_len, args.max_len,
                                       skip_hf=args.skip_transformers)
        vs_hf = (f"{w['continuous_vs_transformers']:.2f}x transformers padded-16, "
                 if "continuous_vs_transformers" in w else "")
        print(f"workload of {args.requests}: continuous {w['ours_continuous']['tokens_per_s']:.1f} tok/s = "
              f"{vs_hf}{w['continuous_vs_dynamic']:.2f}x our dynamic batcher")
    write_json(args.out, finish(res))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
