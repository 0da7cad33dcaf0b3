"""Benchmark: character-level Shakespeare, our trainer side by side with nanoGPT's loop (configs/shakespeare-char.toml).

Reads ../shared/data/tinyshakespeare.txt directly, one token per character, splits 90/10 by position
(nanoGPT's setup), and trains the config's 4-layer / 4-head / 128-embd GPT (context 64, batch 12, 2,000
steps, dropout 0) three ways, interleaved over --trials trials (the order rotates each trial), in one process:

    ours         tinystack.train.train with the config's [train] as shipped: what `tinystack train` runs
                 (dtype "auto": float32 or bf16 autocast, measured at start; the choice is recorded); called
                 as train does it, train_model over a BatchSampler, one that notes when each step draws
    nanogpt      benchmarks/bare_gpt_loop.BareLoop as nanoGPT ships for CPU: float32, unfused AdamW, no
                 compile, .item() every step, val loss every eval_interval (the anchor of the target)
    bare_same    the same bare loop with our precision, fused AdamW, foreach clipping: what our loop itself costs

tokens/s is steps x batch x context over the whole call's wall time (model build, the precision probe, the
periodic val losses included), median over trials. Reported: ours/nanogpt (target >= 1.2x), ours/bare_same,
final val loss of each on 200 fixed batches (target <= 1.85), a 200-character sample and a PNG loss curve.

The step (issue 17: our step vs a bare forward/backward/AdamW step of the same model, overhead <= 10 %): each
loop's clock reading at every step's start (ours: when the loop draws the step's batch, a BatchSampler that notes
the time; bare: BareLoop.starts) gives each whole step's time, from its start to the next step's: everything the
loop does for it, logging included. Steady state = after the first WARMUP steps, leaving out the steps that also
score the val loss; per run the median, then the median over trials. step_overhead_vs_bare_same = ours' step /
bare_same's step - 1 (same model, same precision, same batch, same clipping).

    .venv/bin/python benchmarks/bench_train_shakespeare.py [--quick] [--trials 3] [--threads N] [--set k=v]

--quick: 60 steps per run, 3 trials, val on 20 batches, no val target, no PNG: proves the benchmark works
and gives a rough ratio (-> results/train_shakespeare_quick.json, untracked: a smoke result is not a figure;
the precision probe's fixed cost weighs far more in 60 steps than in 2,000). --threads: torch intra-op
threads for all three (default: torch's own, one per core).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bare_gpt_loop import BareLoop
from bench_common import RESULTS, ROOT, finish, machine, step_periods
from tinystack.atomic import write_json
from tinystack.config import load_config
from tinystack.eval.scoring import score_batches, window_batches
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.tokenizer import CharTokenizer
from tinystack.train.batches import BatchSampler
from tinystack.train.loop import train_model
from tinystack.train.plot import plot_loss_curve
from tinystack.train.precision import autocast

DATA = ROOT.parent / "shared/data/tinyshakespeare.txt"
TARGET_VAL, TARGET_RATIO, TARGET_STEP_OVERHEAD = 1.85, 1.2, 0.10
WARMUP = 5  # steps left out of the step times: first-call allocations, kernel selection, AdamW's lazy state
QUICK = ["train.max_iters=60", "train.eval_interval=30", "train.eval_iters=5", "train.warmup_iters=10"]


class ClockedSampler(BatchSampler):
    """Our loop's batch source, noting the time at every draw: the start of a step."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.starts: list[float] = []

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.starts.append(time.perf_counter())
        return super().sample(n)


def load_split(path: Path, val_fraction: float = 0.1) -> tuple[CharTokenizer, np.ndarray, np.ndarray]:
    """Char tokenizer over the whole text (as nanoGPT), ids cut by position: first 90% train, last 10% val."""
    text = path.read_text(encoding="utf-8")
    tok = CharTokenizer.train([text])
    ids = np.asarray(tok.encode_ordinary(text), dtype=np.uint16)
    cut = int(len(ids) * (1 - val_fraction))
    return tok, ids[:cut], ids[cut:]


@torch.no_grad()
def sample(model: GPT, tok: CharTokenizer, n_chars: int, seed: int = 0, prompt: str = "\n") -> str:
    """Temperature-1 sampling, the context cropped to the last block_size characters."""
    gen = torch.Generator().manual_seed(seed)
    ids = tok.encode_ordinary(prompt)
    for _ in range(n_chars):
        logits, _ = model(torch.tensor([ids[-model.config.block_size:]]))
        ids.append(int(torch.multinomial(torch.softmax(logits[0, -1], -1), 1, generator=gen)))
    return tok.decode(ids[len(prompt):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs/shakespeare-char.toml")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--quick", action="store_true", help="60 steps per run: a smoke test and a rough ratio")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, (QUICK if args.quick else []) + args.overrides)
    out_path = args.out or RESULTS / ("train_shakespeare_quick.json" if args.quick else "train_shakespeare.json")
    tok, train_ids, val_ids = load_split(args.data, cfg.tokenizer.position_split or 0.1)
    m, tc = cfg.model, cfg.train
    gcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout)
    tokens_per_run = tc.max_iters * tc.batch_size * m.block_size
    B, T = tc.batch_size, m.block_size  # fixed evenly spaced val windows (eval.scoring.window_batches)
    loop_val = window_batches(val_ids, T, tc.eval_iters * B, B)  # what both loops score en route
    final_val = window_batches(val_ids, T, (20 if args.quick else 200) * B, B)
    # --quick is a smoke test, not a figure: its JSON is untracked (.gitignore), its log goes to a temporary folder
    log = (Path(tempfile.mkdtemp()) if args.quick else out_path.parent) / (out_path.stem + "_log.jsonl")
    res: dict[str, Any] = {"machine": machine()}
    kept: dict[str, Any] = {}

    step_ms: dict[str, list[float]] = {"ours": [], "nanogpt": [], "bare_same": []}  # per trial: median step
    quarters: dict[str, list[list[float]]] = {k: [] for k in step_ms}  # per trial: median of each quarter of the run

    def steady_ms(name: str, starts: list[float]) -> None:
        def scores_val(i: int) -> bool:
            return (i + 1) % tc.eval_interval == 0 or i + 1 == tc.max_iters
        periods = step_periods(starts, warmup=WARMUP, skip=scores_val)
        step_ms[name].append(statistics.median(periods) * 1e3)
        # a step that slows as the run goes on (numerics, memory, the machine) shows here, not in one median
        quarters[name].append([round(statistics.median(q) * 1e3, 2) for q in np.array_split(periods, 4) if len(q)])

    def ours() -> float:
        # `tinystack train` (train.train) is exactly this call with a plain BatchSampler; the JSONL log every
        # step, as it writes it (each trial rewrites it; the last one stays)
        sampler = ClockedSampler(train_ids, m.block_size, tc.seed)
        model, result = train_model(lambda: GPT(gcfg), sampler, loop_val, tc, log_path=log, progress=False)
        steady_ms("ours", sampler.starts)
        kept["ours"] = (model, result)
        kept.setdefault("dtypes", []).append(result.dtype)
        with autocast(result.dtype, "cpu"):
            return score_batches(model, final_val).loss

    def bare(name: str, dtype: str, fused: bool) -> Callable[[], float]:
        def run() -> float:
            loop = BareLoop(train_ids, tok.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd, tc.batch_size,
                            tc, dtype=dtype, fused=fused, val_batches=loop_val)
            loop.run(tc.max_iters)
            steady_ms(name, loop.starts)
            return loop.val_loss(final_val)
        return run

    for dtype in ("float32", "bfloat16"):  # untimed warm-up: the process's first kernels (oneDNN) for these shapes
        BareLoop(train_ids, tok.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd, tc.batch_size, tc,
                 dtype=dtype).run(3)
    runners: dict[str, Callable[[], float]] = {"ours": ours, "nanogpt": bare("nanogpt", "float32", False)}
    tps: dict[str, list[float]] = {k: [] for k in [*runners, "bare_same"]}
    vals: dict[str, float] = {}
    for trial in range(args.trials):
        names = list(tps)
        for name in names[trial % len(names):] + names[:trial % len(names)]:  # rotate: no runner always first
            if name == "bare_same":  # our precision choice is known once `ours` has run (trial 0 runs it first)
                runners[name] = bare(name, kept["ours"][1].dtype, True)
            t0 = time.perf_counter()
            vals[name] = runners[name]()
            tps[name].append(tokens_per_run / (time.perf_counter() - t0))
            print(f"trial {trial + 1}/{args.trials} {name:9s} {tps[name][-1]:8,.0f} tokens/s  "
                  f"step {step_ms[name][-1]:6.1f} ms  val {vals[name]:.4f}", flush=True)
    model, result = kept["ours"]
    med = {k: statistics.median(v) for k, v in tps.items()}
    med_ms = {k: statistics.median(v) for k, v in step_ms.items()}
    overhead = med_ms["ours"] / med_ms["bare_same"] - 1
    probe_s = result.precision_probe["probe_s"] if result.precision_probe else 0.0
    res.update({
        "config": os.path.relpath(args.config, ROOT), "quick": args.quick, "trials": args.trials,
        "steps": tc.max_iters, "batch_size": tc.batch_size, "block_size": m.block_size, "params": model.num_params(),
        "vocab_size": tok.vocab_size, "threads": torch.get_num_threads(),
        "precision": {"ours_per_trial": kept["dtypes"], "probe_last_trial": result.precision_probe},
        "tokens_per_s": {k: round(v, 1) for k, v in med.items()},
        "tokens_per_s_trials": {k: [round(x, 1) for x in v] for k, v in tps.items()},
        "ours_over_nanogpt": round(med["ours"] / med["nanogpt"], 3),
        "ours_over_bare_same": round(med["ours"] / med["bare_same"], 3),
        # the probe is a fixed cost (~12 forward/backward passes): ~1% of 2,000 steps, much more of --quick's 60
        "probe_share_of_ours_last_trial": round(probe_s * tps["ours"][-1] / tokens_per_run, 3),
        # the step itself, steady state (WARMUP steps and the val-loss steps left out): median ms over trials
        "step_ms": {k: round(v, 2) for k, v in med_ms.items()},
        "step_ms_trials": {k: [round(x, 2) for x in v] for k, v in step_ms.items()}, "step_ms_quarters": quarters,
        "step_warmup_left_out": WARMUP, "step_overhead_vs_bare_same": round(overhead, 4),
        "val_loss_final": {k: round(v, 4) for k, v in vals.items()}, "val_batches_final": len(final_val),
        "target": {"ours_over_nanogpt": TARGET_RATIO, "val_loss": TARGET_VAL,
                   "step_overhead_vs_bare_same": TARGET_STEP_OVERHEAD},
    })
    if not args.quick:
        res["met"] = res["ours_over_nanogpt"] >= TARGET_RATIO and vals["ours"] <= TARGET_VAL
        res["step_overhead_met"] = overhead <= TARGET_STEP_OVERHEAD
    res["sample"] = sample(model, tok, 200)
    if not args.quick:
        png = plot_loss_curve(log, out_path.with_suffix(".png"), title="shakespeare-char: loss (ours, CPU)")
        res.update(png=os.path.relpath(png, ROOT), log=os.path.relpath(log, ROOT))
    write_json(out_path, finish(res))
    print(f"precision per trial: {kept['dtypes']} (last: {result.precision_probe or 'as configured'})")
    print(f"tokens/s (median of {args.trials}): ours {med['ours']:,.0f}, nanoGPT loop {med['nanogpt']:,.0f}, "
          f"bare loop with our settings {med['bare_same']:,.0f} -> ours/nanoGPT {res['ours_over_nanogpt']:.2f}x "
          f"(target >= {TARGET_RATIO}x), ours/bare_same {res['ours_over_bare_same']:.2f}x")
    print(f"step, steady state (median of {args.trials}): ours {med_ms['ours']:.1f} ms, nanoGPT loop "
          f"{med_ms['nanogpt']:.1f} ms, bare loop with our settings {med_ms['bare_same']:.1f} ms -> our overhead "
          f"{100 * overhead:+.1f} % (target <= {100 * TARGET_STEP_OVERHEAD:.0f} %)")
    val_txt = ", ".join(f"{k} {v:.4f}" for k, v in vals.items())
    print(f"val loss on {len(final_val)} batches: {val_txt} (target <= {TARGET_VAL}"
          f"{'; not checked in --quick' if args.quick else ''})")
    print(f"load average {res['machine']['loadavg_at_start'][0]:.1f} -> {res['machine']['loadavg_at_end'][0]:.1f}"
          f"; sample:\n{res['sample']}\n-> {os.path.relpath(out_path, ROOT)}")


if __name__ == "__main__":
    t_start = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t_start:.0f} s")
