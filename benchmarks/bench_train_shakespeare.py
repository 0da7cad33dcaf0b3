"""Benchmark: character-level Shakespeare with the PyTorch trainer (configs/shakespeare-char.toml).

Reads ../shared/data/tinyshakespeare.txt directly, one token per character, splits 90/10
by position (nanoGPT's setup), trains the config's 4-layer / 4-head / 128-embd GPT
(context 64, batch 12, 2,000 steps, dropout 0) and reports the final val loss (target
<= 1.85; also measured on 200 fixed batches, nanoGPT's eval_iters), wall time, tokens/s,
a 200-character sample, and a PNG loss curve. Then, in the same process, the same steps of
nanoGPT's loop (`bare_gpt_loop.BareLoop`: the same model in plain PyTorch, a bare
forward/backward/clip/AdamW loop) for the side-by-side figure: tokens/s ours vs bare, and
its val loss on the same 200 batches (--no-bare skips it).

    .venv/bin/python benchmarks/bench_train_shakespeare.py [--threads 1] [--set train.max_iters=N] [--no-bare]

--threads: torch intra-op threads (default 1: on the shared 2-core machine, 2 threads
oversubscribe the cores and run ~10x slower than 1).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bare_gpt_loop import BareLoop
from tinystack.atomic import write_json
from tinystack.config import load_config
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.tokenizer import CharTokenizer
from tinystack.train import estimate_loss, train
from tinystack.train.batches import eval_batches
from tinystack.train.plot import plot_loss_curve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # bare_gpt_loop, when run as a script from elsewhere
DATA = ROOT.parent / "shared/data/tinyshakespeare.txt"


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


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs/shakespeare-char.toml")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--no-bare", action="store_true", help="skip the side-by-side bare nanoGPT-style loop")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/train_shakespeare.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    tok, train_ids, val_ids = load_split(args.data, cfg.tokenizer.position_split or 0.1)
    m = cfg.model
    gcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout)
    log = args.out.with_name("train_shakespeare_log.jsonl")
    load_before = os.getloadavg()
    model, result = train(gcfg, train_ids, val_ids, cfg.train, log_path=log, progress=True)
    cfg.train.eval_iters = 200
    val_200 = estimate_loss(model, val_ids, cfg.train, torch.device("cpu"))
    bare = None
    if not args.no_bare:
        loop = BareLoop(train_ids, tok.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd,
                        cfg.train.batch_size, cfg.train)
        secs = loop.run(cfg.train.max_iters)
        bare_tps = cfg.train.max_iters * cfg.train.batch_size * m.block_size / secs
        val_batches = eval_batches(val_ids, cfg.train.batch_size, m.block_size, 200)
        bare = {"tokens_per_s": round(bare_tps, 1), "wall_s": round(secs, 1),
                "val_loss_200_batches": round(loop.val_loss(val_batches), 4),
                "ours_over_bare": round(result.tokens_per_s / bare_tps, 3)}
    text = sample(model, tok, 200)
    png = plot_loss_curve(log, args.out.with_suffix(".png"), title="shakespeare-char: loss (PyTorch, CPU)")
    out = {
        "config": str(args.config.relative_to(ROOT)), "params": model.num_params(), "vocab_size": tok.vocab_size,
        "train_tokens": int(len(train_ids)), "val_tokens": int(len(val_ids)), "steps": result.steps,
        "val_loss": round(result.final_val_loss, 4), "val_loss_200_batches": round(val_200, 4),
        "train_loss": round(result.final_train_loss, 4), "target_val_loss": 1.85,
        "met": val_200 <= 1.85 and result.final_val_loss <= 1.85,
        "wall_s": round(result.wall_s, 1), "tokens_per_s": round(result.tokens_per_s, 1), "threads": args.threads,
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "bare_loop": bare, "cpu": _cpu_model(), "sample": text,
        "png": os.path.relpath(png, ROOT), "log": os.path.relpath(log, ROOT),
    }
    write_json(args.out, out)
    print(f"val loss {result.final_val_loss:.4f} ({cfg.train.eval_iters} batches: {val_200:.4f}; target <= 1.85, "
          f"{'met' if out['met'] else 'NOT met'}), {result.steps} steps in {result.wall_s:.1f} s, "
          f"{result.tokens_per_s:,.0f} tokens/s ({args.threads} thread(s), load {load_before[0]:.1f})")
    if bare:
        print(f"bare nanoGPT-style loop: {bare['tokens_per_s']:,.0f} tokens/s, val {bare['val_loss_200_batches']:.4f} "
              f"(200 batches) -> ours/bare tokens/s {bare['ours_over_bare']:.2f}x")
    print("sample:\n" + text)
    print(f"-> {os.path.relpath(args.out, ROOT)}, {out['png']}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.0f} s")
