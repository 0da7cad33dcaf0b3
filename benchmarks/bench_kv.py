"""KV cache vs recompute: 128 new tokens after prompts of 64-1,024 tokens (GPT-2-124M shape, float32).

With the cache (the engine, kv_cache="contiguous", batch 1): prefill once, then one token
per forward. Recompute (`tinystack.infer.bench.Recompute`, the baseline `tinystack bench kv`
runs on the engine): every new token runs the model over the whole sequence so far (only
the last position through the output head, to be fair to it). Its 128 forwards are too slow to run
in full at long prompts on this machine, so a few are timed (steps 0, 42, 85, 127 by
default) and the rest integrated by the trapezoid rule (times: CPU seconds, one torch thread;
see bench_common.timed); at each timed step the recomputed
argmax must equal the token the cached decode produced. Writes
benchmarks/results/kv_cache.json and kv_cache.png.

    .venv/bin/python benchmarks/bench_kv.py [--threads 1] [--prompts 64,128,256,512,1024] [--samples 4]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine, timed  # noqa: E402
from bench_infer_common import IdTokenizer, gpt2_124m, random_prompt  # noqa: E402
from tinystack.atomic import atomic_open, write_json  # noqa: E402
from tinystack.infer import LLM, SamplingParams  # noqa: E402
from tinystack.infer.bench import Recompute  # noqa: E402

NEW = 128


@torch.inference_mode()
def recompute_step(model: Recompute, seq: list[int]) -> tuple[float, int]:
    _, dt, logits = timed(lambda: model.last_logits(seq))
    return dt, int(logits.argmax())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", default="64,128,256,512,1024")
    ap.add_argument("--samples", type=int, default=4, help="recompute steps timed per prompt length")
    ap.add_argument("--out", type=Path, default=RESULTS / "kv_cache.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.prompts.split(",")]
    ours, _ = gpt2_124m(block_size=max(lengths) + NEW)  # past GPT-2's 1,024 positions: 1,024 + 128 new
    llm = LLM(ours, IdTokenizer(), kv_cache="contiguous", max_num_seqs=1, max_num_batched_tokens=max(lengths))
    llm.generate([random_prompt(16, 0)], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    baseline = Recompute(ours)
    rows = []
    for L in lengths:
        prompt = random_prompt(L, seed=L)
        # prompt=prompt binds this iteration's prompt (timed calls the lambda at once; explicit all the same)
        _, t_cache, out = timed(lambda prompt=prompt: llm.generate(
            [prompt], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))[0].token_ids)
        steps = sorted({round(i * (NEW - 1) / (args.samples - 1)) for i in range(args.samples)})
        times = []
        for i in steps:
            dt, tok = recompute_step(baseline, prompt + out[:i])
            assert tok == out[i], f"recompute diverged from the cached decode at prompt {L}, step {i}"
            times.append(dt)
        # trapezoid over the timed steps: estimated total of all NEW recompute forwards
        t_recompute = sum((times[j] + times[j + 1]) / 2 * (steps[j + 1] - steps[j]) for j in range(len(steps) - 1))
        t_recompute += (times[0] + times[-1]) / 2  # the integral spans NEW - 1 gaps; NEW forwards in all
        rows.append({"prompt_tokens": L, "cache_s": t_cache, "recompute_s_estimated": t_recompute,
                     "recompute_step_s": dict(zip(steps, times)), "speedup": t_recompute / t_cache,
                     "cache_tokens_per_s": NEW / t_cache, "recompute_tokens_per_s": NEW / t_recompute})
        print(f"prompt {L:5d}: cache {t_cache:7.2f} s, recompute ~{t_recompute:8.1f} s "
              f"-> {t_recompute / t_cache:6.1f}x", flush=True)
    speedup_at_1024 = next((r["speedup"] for r in rows if r["prompt_tokens"] == 1024), None)
    res = finish({"model": "GPT-2-124M shape, random weights, float32", "new_tokens": NEW, "machine": machine(),
                  "rows": rows, "speedup_at_1024": speedup_at_1024})
    write_json(args.out, res)
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


def plot(rows: list[dict], path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()

    x = [r["prompt_tokens"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(x, [r["cache_tokens_per_s"] for r in rows], "o-", label="KV cache")
    ax[0].plot(x, [r["recompute_tokens_per_s"] for r in rows], "s--", label="recompute")
    ax[0].set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="new tokens / s", title="128 new tokens")
    ax[0].legend()
    ax[1].plot(x, [r["speedup"] for r in rows], "o-")
    ax[1].axhline(10, color="gray", ls=":")
    ax[1].set(xscale="log", xlabel="prompt tokens", ylabel="speed-up (x)", title="KV cache / recompute")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


if __name__ == "__main__":
    main()
