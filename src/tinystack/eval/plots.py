"""The report's plots as PNG bytes (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np


def _png(fig: Any) -> bytes:
    # deferred: matplotlib only when a figure is drawn
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _figure(width: float = 7.0, height: float = 3.6) -> tuple[Any, Any]:
    # deferred: matplotlib only when a figure is drawn
    from tinystack.plotting import pyplot

    plt = pyplot()

    return plt.subplots(figsize=(width, height))


def training_curve(log: Sequence[dict[str, Any]]) -> bytes:
    """Train loss per step (and val loss where the log has it) from train_log.jsonl records."""
    fig, ax = _figure()
    steps = [r["step"] for r in log]
    ax.plot(steps, [r["loss"] for r in log], lw=0.8, alpha=0.7, label="train loss")
    val = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    if val:
        ax.plot(*zip(*val), "o-", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("training loss")
    ax.legend()
    ax.grid(alpha=0.3)
    return _png(fig)


def loss_per_source(by_source: dict[str, dict[str, Any]], total_loss: float, max_bars: int = 20) -> bytes:
    """Horizontal bars: loss of each source (the max_bars with the most tokens), worst on top."""
    items = sorted(by_source.items(), key=lambda kv: -kv[1]["tokens"])[:max_bars]
    items.sort(key=lambda kv: kv[1]["loss"])
    fig, ax = _figure(7.0, max(2.5, 0.28 * len(items) + 1.2))
    ax.barh([k[:40] for k, _ in items], [v["loss"] for _, v in items], color="tab:blue")
    ax.axvline(total_loss, color="tab:red", ls="--", label=f"split mean {total_loss:.2f}")
    ax.set_xlabel("val loss (nats/token)")
    ax.set_title(f"val loss per source ({len(items)} largest of {len(by_source)})")
    ax.legend(loc="lower right")
    return _png(fig)


def loss_vs_length(tokens: Sequence[int], loss: Sequence[float], edges: Sequence[int]) -> bytes:
    """One dot per document (log length axis), with the mean loss of each length bucket."""
    fig, ax = _figure()
    t, lo = np.asarray(tokens), np.asarray(loss)
    ax.scatter(t, lo, s=6, alpha=0.4, label="document")
    bounds = [0, *edges, int(t.max()) + 1 if len(t) else 1]
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = (t >= a) & (t < b)
        if m.any():
            ax.hlines((lo * t)[m].sum() / t[m].sum(), max(a, 1), b, colors="tab:red", lw=2)
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("mean loss (nats/token)")
    ax.set_title("val loss against length (red: token-weighted bucket loss)")
    ax.grid(alpha=0.3)
    return _png(fig)
