"""The loss curve: a PNG drawn from the JSONL training log (train loss per step, val loss where measured)."""
from __future__ import annotations

import json
from pathlib import Path

from tinystack.atomic import atomic_open


def read_log(log_path: str | Path) -> list[dict]:
    with open(log_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_loss_curve(log_path: str | Path, png_path: str | Path, title: str = "training loss") -> Path:
    """Write `png_path` (atomically). Needs matplotlib (Agg backend, no display)."""
    # deferred: matplotlib only when a figure is drawn
    from tinystack.plotting import pyplot

    plt = pyplot()

    rows = read_log(log_path)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=0.8, alpha=0.7, label="train (per step)")
    val = [r for r in rows if "val_loss" in r]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_open(png_path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return Path(png_path)
