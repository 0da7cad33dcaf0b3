"""The end-of-run summary table (records in, drops per step and reason, dedup rate,
clusters, leakage), shared by `tinystack data ...` and `tinystack run`."""
from __future__ import annotations

from typing import Any

from rich.table import Table


def summary_table(manifest: dict[str, Any], title: str) -> Table:
    """A rich Table from a manifest-like dict with ``steps`` (and optional totals)."""
    table = Table(title=title)
    for col in ("step", "in", "kept", "dropped", "notes"):
        table.add_column(col, justify="right" if col in ("in", "kept") else "left")
    for step in manifest["steps"]:
        dropped = ", ".join(f"{r}: {n:,}" for r, n in step["dropped"].items()) or "-"
        extra = step.get("extra", {})
        notes = []
        if "clusters" in extra:
            notes.append(f"{extra['clusters']:,} clusters")
        if "leaked" in extra:
            notes.append("leaked " + ", ".join(f"{k} {v:,}" for k, v in extra["leaked"].items()))
        if "cut" in extra:
            notes.append(f"ppl cut {extra['cut']}")
        table.add_row(step["name"], f"{step['in']:,}", f"{step['kept']:,}", dropped, "; ".join(notes))
    if "dedup_rate" in manifest:
        table.caption = (f"records in {manifest.get('records_in', 0):,} -> out {manifest.get('records_out', 0):,}; "
                         f"dedup rate {manifest['dedup_rate']:.2%}; leakage removed {manifest.get('leakage', 0):,}"
                         + (f"; {manifest['docs_per_s']:,.0f} docs/s" if manifest.get("docs_per_s") else ""))
    return table
