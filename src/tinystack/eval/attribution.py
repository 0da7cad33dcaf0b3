"""Bad-case attribution: which documents, sources and lengths the loss comes from, and what leaked.

    worst_cases       the k scored documents with the highest mean loss per token, with their
                      source, length, cluster_id and the near duplicate they have in train
    source_blame      per source: share of the split's total loss vs share of its tokens, and
                      "excess nats" = nats - tokens x split mean loss, i.e. how much loss the
                      source adds beyond what an average source of its size would
    leakage           share of held-out documents with a near duplicate in train (via
                      `neardup.find_near_duplicates`, the data layer's MinHash)
    findings          the same in sentences: the worst slices and by how much
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinystack.eval.scoring import DocScores


def worst_cases(scores: DocScores, records: Sequence[dict[str, Any]], k: int = 10, *, min_tokens: int = 8,
                near_dups: Sequence[tuple[int, float] | None] | None = None,
                train_ids: Sequence[Any] | None = None, preview_chars: int = 160) -> list[dict[str, Any]]:
    """Top-k documents by mean loss/token among those with >= min_tokens scored tokens."""
    loss = np.where(scores.tokens >= min_tokens, scores.loss, -np.inf)
    order = [int(i) for i in np.argsort(-loss, kind="stable") if np.isfinite(loss[i])][:k]
    out = []
    for i in order:
        r = records[i]
        dup = near_dups[i] if near_dups is not None else None
        out.append({
            "index": i,
            "id": r.get("id"),
            "source": r.get("source"),
            "cluster_id": r.get("cluster_id"),
            "loss": float(scores.loss[i]),
            "tokens": int(scores.tokens[i]),
            "chars": len(r["text"]),
            "near_duplicate_in_train": dup is not None,
            "train_match": None if dup is None else {
                "id": train_ids[dup[0]] if train_ids is not None else dup[0], "jaccard": round(dup[1], 3)},
            "text": r["text"][:preview_chars],
        })
    return out


def source_blame(by_source: dict[str, dict[str, Any]], total: dict[str, Any]) -> list[dict[str, Any]]:
    """Sources ordered by the excess loss they add (see module docstring)."""
    mean = total["loss"]
    rows = []
    for src, m in by_source.items():
        rows.append({"source": src, "loss": m["loss"], "ratio_to_mean": m["loss"] / mean if mean else float("nan"),
                     "loss_share": m["nats"] / total["nats"] if total["nats"] else 0.0,
                     "token_share": m["tokens"] / total["tokens"] if total["tokens"] else 0.0,
                     "excess_nats": m["nats"] - m["tokens"] * mean, "docs": m["docs"], "tokens": m["tokens"]})
    return sorted(rows, key=lambda r: -r["excess_nats"])


def leakage(near_dups: Sequence[tuple[int, float] | None], records: Sequence[dict[str, Any]],
            train_ids: Sequence[Any] | None = None) -> dict[str, Any]:
    """Share of `records` with a near duplicate in train, and which ones."""
    leaked = [{"id": records[i].get("id"), "source": records[i].get("source"),
               "train_id": train_ids[d[0]] if train_ids is not None else d[0], "jaccard": round(d[1], 3)}
              for i, d in enumerate(near_dups) if d is not None]
    n = len(near_dups)
    return {"checked": n, "leaked": len(leaked), "rate": len(leaked) / n if n else 0.0, "examples": leaked[:20]}


def _worst_slice(slices: dict[str, dict[str, Any]], total: dict[str, Any], min_share: float) -> tuple[str, dict] | None:
    big = {k: v for k, v in slices.items() if v["tokens"] >= min_share * total["tokens"]}
    return max(big.items(), key=lambda kv: kv[1]["loss"]) if big else None


def findings(split: str, report: dict[str, Any], *, min_share: float = 0.02) -> list[str]:
    """Sentences naming the worst source, the worst length bucket, the top excess-loss source,
    the make-up of the worst cases, and the leakage rate."""
    total = report["total"]
    lines = [f"{split}: loss {total['loss']:.3f} nats/token ({total['bits_per_byte']:.3f} bits/byte, "
             f"accuracy {total['accuracy']:.1%}) over {total['docs']:,} documents / {total['tokens']:,} tokens."]
    for kind, key in (("source", "by_source"), ("length bucket", "by_length")):
        worst = _worst_slice(report[key], total, min_share)
        if worst and len(report[key]) > 1:
            name, m = worst
            lines.append(f"Worst {kind} ({split}): `{name}` at {m['loss']:.3f} nats/token, "
                         f"{m['loss'] / total['loss']:.2f}x the split's {total['loss']:.3f} "
                         f"({m['loss'] - total['loss']:+.3f}), over {m['tokens']:,} tokens "
                         f"({m['tokens'] / total['tokens']:.0%} of the split).")
    blame = report.get("source_blame") or []
    if blame and blame[0]["excess_nats"] > 0:
        b = blame[0]
        lines.append(f"Most excess loss ({split}): `{b['source']}` holds {b['token_share']:.1%} of the tokens but "
                     f"{b['loss_share']:.1%} of the loss ({b['excess_nats']:,.0f} nats above an average source).")
    worst = report.get("worst_cases") or []
    if worst:
        srcs: dict[str, int] = {}
        for w in worst:
            srcs[w["source"]] = srcs.get(w["source"], 0) + 1
        top, n = max(srcs.items(), key=lambda kv: kv[1])
        dups = sum(w["near_duplicate_in_train"] for w in worst)
        lines.append(f"Of the {len(worst)} worst {split} documents, {n} come from `{top}`"
                     f"{f'; {dups} have a near duplicate in train' if dups else ''}.")
    leak = report.get("leakage")
    if leak:
        lines.append(f"Leakage ({split}): {leak['leaked']:,} of {leak['checked']:,} documents "
                     f"({leak['rate']:.1%}) have a near duplicate in train.")
    return lines
