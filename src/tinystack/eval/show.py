"""Console output of evaluation results (rich tables); the same dicts go to the JSON files."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_eval(console: Console, results: dict[str, Any]) -> None:
    """One line per split, the per-source table of val, the findings, the generation checks."""
    for split in ("val", "test"):
        r = results.get(split, {})
        if "loss" not in r:
            console.print(f"eval {split}: {r.get('skipped', 'no data')}")
            continue
        console.print(f"eval {split}: loss {r['loss']:.3f}, perplexity {r['perplexity']:.1f}, "
                      f"bits/byte {r['bits_per_byte']:.3f}, accuracy {r['accuracy']:.1%} over {r['tokens']:,} tokens")
    docs = results.get("val", {}).get("docs")
    if docs:
        table = Table(title="val loss per source (worst 8 by excess loss)")
        for col in ("source", "docs", "tokens", "loss", "x mean", "loss share"):
            table.add_column(col)
        for b in docs["source_blame"][:8]:
            table.add_row(b["source"], f"{b['docs']:,}", f"{b['tokens']:,}", f"{b['loss']:.3f}",
                          f"{b['ratio_to_mean']:.2f}", f"{b['loss_share']:.1%}")
        console.print(table)
    for line in results.get("findings", []):
        console.print(f"  - {line}")
    gen = results.get("generation")
    if gen:
        console.print("generation: " + "; ".join(
            f"{k} distinct-1 {gen[k]['distinct_1']:.2f} distinct-2 {gen[k]['distinct_2']:.2f} "
            f"repetition {gen[k]['mean_repetition_rate']:.2f} looping {gen[k]['looping']}/{len(gen[k]['samples'])}"
            for k in ("greedy", "sampled")))


def regression_table(result: dict[str, Any]) -> Table:
    """NEW vs BASELINE per case (or NEW alone when there is no baseline)."""
    if "rows" in result:
        table = Table(title=f"regression: {result['model']} vs baseline {result['summary']['baseline']}")
        for col in ("case", "expect", "baseline", "new", "delta", "verdict"):
            table.add_column(col)
        style = {"worse": "red", "better": "green", "same": "dim"}
        for r in result["rows"]:
            table.add_row(r["id"], r["expect"], _cell(r["baseline"], r["baseline_passed"]),
                          _cell(r["new"], r["new_passed"]), f"{r['delta']:+.3f}",
                          f"[{style[r['verdict']]}]{r['verdict']}[/]")
        return table
    table = Table(title=f"regression set on {result['model']}")
    for col in ("case", "expect", "score", "passed"):
        table.add_column(col)
    for r in result["new"]["cases"]:
        table.add_row(r["id"], r["expect"], f"{r['score']:.3f}", "yes" if r["passed"] else "[red]no[/]")
    return table


def _cell(score: float, passed: bool) -> str:
    return f"{score:.3f} ({'pass' if passed else 'FAIL'})"


def print_regression(console: Console, result: dict[str, Any]) -> None:
    console.print(regression_table(result))
    s = result["summary"]
    if s.get("baseline"):
        mean = (f", mean loss {s['baseline_mean_loss']:.3f} -> {s['new_mean_loss']:.3f}"
                if s.get("new_mean_loss") is not None and s.get("baseline_mean_loss") is not None else "")
        console.print(f"regression: {s['better']} better, {s['worse']} worse, {s['same']} same "
                      f"(tolerance {s['tolerance']} nats/byte){mean}; passed {s['baseline_passed']} -> "
                      f"{s['new_passed']} of {s['total']}" + (" [red]REGRESSED[/]" if s["regressed"] else ""))
    else:
        console.print(f"regression: {s['new_passed']} of {s['total']} cases pass (no baseline to compare with)")
