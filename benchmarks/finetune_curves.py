"""bench_finetune.py --curves-steps N: fine-tune SmolLM2 both ways (full, LoRA) on the planted-facts set of
tests/train/planted_facts.py through `tinystack.train.finetune` (the finetune command's code path) and plot the two
loss curves, train and held-out, to one PNG.

    loss_curves(model_dir, steps, rank, threads, dtype, out_png) -> {method: {learning_rate, log, heldout, dtype}}
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench_common import ROOT
from tinystack.config import FINETUNE_DEFAULTS, load_config


def loss_curves(model_dir: Path, steps: int, rank: int, threads: int, dtype: str, out_png: Path) -> dict:
    """Fine-tune on the planted facts both ways (the finetune command's code path); plot both loss curves."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tests/train"))
    from planted_facts import conversations

    from tinystack.train.finetune import finetune

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "chat.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in conversations()), encoding="utf-8")
        for name, lr, r in (("full", 5e-5, 0), (f"lora r={rank}", 3e-3, rank)):
            cfg = load_config(None, [], defaults=FINETUNE_DEFAULTS)
            cfg.run.threads, cfg.train.plot, cfg.train.dtype = threads, False, dtype
            t = cfg.train
            t.max_iters, t.learning_rate, t.min_lr = steps, lr, lr / 10
            cfg.finetune.lora, cfg.finetune.lora_alpha = r, 2.0 * r
            t.eval_interval, cfg.data.val_fraction, t.warmup_iters = max(1, steps // 4), 0.2, 3
            # the loss curves of a fixed number of steps: no early stop, no guard or replay (bench_finetune_quality)
            t.early_stopping, t.keep_best, cfg.finetune.guard_prompts, cfg.finetune.replay = 0, False, 0, 0
            out = Path(tmp) / name.replace(" ", "_").replace("=", "")
            report = finetune(model_dir, data, out, cfg, progress=False)
            log = [json.loads(x) for x in (out.parent / f"{out.name}_finetune" / "log.jsonl").read_text().splitlines()]
            runs[name] = {"learning_rate": lr, "log": log, "heldout": report["heldout"],
                          "dtype": report["result"]["dtype"]}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for (name, run), color in zip(runs.items(), ("tab:blue", "tab:orange")):
        ax.plot([r["step"] for r in run["log"]], [r["loss"] for r in run["log"]], color=color, alpha=0.7,
                label=f"{name} train (lr {run['learning_rate']:g})")
        val = [r for r in run["log"] if "val_loss" in r]
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o--", color=color, label=f"{name} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on assistant tokens (nats/token)")
    ax.set_title("SmolLM2-135M on the planted-facts set: full vs LoRA")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return runs
