"""Benchmark: character-level Shakespeare, our trainer side by side with nanoGPT's loop (configs/shakespeare-char.toml).

Reads ../shared/data/tinyshakespeare.txt directly, one token per character, splits 90/10 by position
(nanoGPT's setup), and trains the config's 4-layer / 4-head / 128-embd GPT (context 64, batch 12, 2,000
steps, dropout 0) three ways, interleaved over --trials trials (the order rotates each trial), in one process:

    ours         tinystack.train.train with the config's [train] as shipped: what `tinystack train` runs
                 (dtype "auto": float32 or bf16 autocast, measured at start; the choice is recorded)
    nanogpt      benchmarks/bare_gpt_loop.BareLoop as nanoGPT ships for CPU: float32, unfused AdamW, no
                 compile, .item() every step, val loss every eval_interval (the anchor of the target)
    bare_same    the same bare loop with our precision, fused AdamW, foreach clipping: what our loop itself costs

tokens/s is steps x batch x context over the whole call's wall time (model build, the precision probe, the
periodic val losses included), median over trials. Reported: ours/nanogpt (target >= 1.2x), ours/bare_same,
final val loss of each on 200 fixed batches (target <= 1.85), a 200-character sample and a PNG loss curve.

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
from bench_common import RESULTS, ROOT, finish, machine
from tinystack.atomic import write_json
from tinystack.config import load_config
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.tokenizer import CharTokenizer
from tinystack.train import train
from tinystack.train.batches import eval_batches
from tinystack.train.loop import batches_loss
from tinystack.train.plot import plot_loss_curve

DATA = ROOT.parent / "shared/data/tinyshakespeare.txt"
TARGET_VAL, TARGET_RATIO = 1.85, 1.2
QUICK = ["train.max_iters=60", "train.eval_interval=30", "train.eval_iters=5", "train.warmup_iters=10"]


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
    loop_val = eval_batches(val_ids, tc.batch_size, m.block_size, tc.eval_iters)  # what both loops score en route
    final_val = eval_batches(val_ids, tc.batch_size, m.block_size, 20 if args.quick else 200)
    # --quick is a smoke test, not a figure: its JSON is untracked (.gitignore), its log goes to a temporary folder
    log = (Path(tempfile.mkdtemp()) if args.quick else out_path.parent) / (out_path.stem + "_log.jsonl")
    res: dict[str, Any] = {"machine": machine()}
    kept: dict[str, Any] = {}

    def ours() -> float:
        # the JSONL log every step, as `tinystack train` writes it (each trial rewrites it; the last one stays)
        model, result = train(gcfg, train_ids, val_ids, tc, log_path=log, progress=False)
        kept["ours"] = (model, result)
        kept.setdefault("dtypes", []).append(result.dtype)
        return batches_loss(model, final_val, result.dtype, "cpu")[0]

    def bare(dtype: str, fused: bool) -> Callable[[], float]:
        def run() -> float:
            loop = BareLoop(train_ids, tok.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd, tc.batch_size,
                            tc, dtype=dtype, fused=fused, val_batches=loop_val)
            loop.run(tc.max_iters)
            return loop.val_loss(final_val)
        return run

    for dtype in ("float32", "bfloat16"):  # untimed warm-up: the process's first kernels (oneDNN) for these shapes
        BareLoop(train_ids, tok.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd, tc.batch_size, tc,
                 dtype=dtype).run(3)
    runners: dict[str, Callable[[], float]] = {"ours": ours, "nanogpt": bare("float32", False)}
    tps: dict[str, list[float]] = {k: [] for k in [*runners, "bare_same"]}
    vals: dict[str, float] = {}
    for trial in range(args.trials):
        names = list(tps)
        for name in names[trial % len(names):] + names[:trial % len(names)]:  # rotate: no runner always first
            if name == "bare_same":  # our precision choice is known once `ours` has run (trial 0 runs it first)
                runners[name] = bare(kept["ours"][1].dtype, True)
            t0 = time.perf_counter()
            vals[name] = runners[name]()
            tps[name].append(tokens_per_run / (time.perf_counter() - t0))
            print(f"trial {trial + 1}/{args.trials} {name:9s} {tps[name][-1]:8,.0f} tokens/s  val {vals[name]:.4f}",
                  flush=True)
    model, result = kept["ours"]
    med = {k: statistics.median(v) for k, v in tps.items()}
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
        "val_loss_final": {k: round(v, 4) for k, v in vals.items()}, "val_batches_final": len(final_val),
        "target": {"ours_over_nanogpt": TARGET_RATIO, "val_loss": TARGET_VAL},
    })
    if not args.quick:
        res["met"] = res["ours_over_nanogpt"] >= TARGET_RATIO and vals["ours"] <= TARGET_VAL
    res["sample"] = sample(model, tok, 200)
    if not args.quick:
        png = plot_loss_curve(log, out_path.with_suffix(".png"), title="shakespeare-char: loss (ours, CPU)")
        res.update(png=os.path.relpath(png, ROOT), log=os.path.relpath(log, ROOT))
    write_json(out_path, finish(res))
    print(f"precision per trial: {kept['dtypes']} (last: {result.precision_probe or 'as configured'})")
    print(f"tokens/s (median of {args.trials}): ours {med['ours']:,.0f}, nanoGPT loop {med['nanogpt']:,.0f}, "
          f"bare loop with our settings {med['bare_same']:,.0f} -> ours/nanoGPT {res['ours_over_nanogpt']:.2f}x "
          f"(target >= {TARGET_RATIO}x), ours/bare_same {res['ours_over_bare_same']:.2f}x")
    val_txt = ", ".join(f"{k} {v:.4f}" for k, v in vals.items())
    print(f"val loss on {len(final_val)} batches: {val_txt} (target <= {TARGET_VAL}"
          f"{'; not checked in --quick' if args.quick else ''})")
    print(f"load average {res['machine']['loadavg_at_start'][0]:.1f} -> {res['machine']['loadavg_at_end'][0]:.1f}"
          f"; sample:\n{res['sample']}\n-> {os.path.relpath(out_path, ROOT)}")


if __name__ == "__main__":
    t_start = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t_start:.0f} s")
