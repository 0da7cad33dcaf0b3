"""The run report: report.md and a self-contained report.html (PNG plots inlined as data URIs).

    eval.json + regression.json + train_log.jsonl -> sections (title, sentences, table, plot)
        -> report.md   (plots as files under report_files/)
        -> report.html (the same sections; plots embedded, so the one file can be mailed around)

Both renderings come from one list of `Section`s, so they always say the same thing.
"""
from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinystack.atomic import atomic_open, read_json
from tinystack.eval import plots

ASSETS = "report_files"


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    image: str | None = None  # file name under ASSETS
    png: bytes | None = None


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _metrics_section(ev: dict[str, Any]) -> Section:
    s = Section("Metrics", headers=["split", "loss", "perplexity", "bits/byte", "accuracy", "tokens"])
    for split in ("val", "test"):
        r = ev.get(split, {})
        if "loss" in r:
            s.rows.append([split, _f(r["loss"]), _f(r["perplexity"], ".1f"), _f(r["bits_per_byte"]),
                           _f(r["accuracy"], ".1%"), f"{r['tokens']:,}"])
    s.text.append("Fixed non-overlapping windows over each split's token file (deterministic).")
    return s


def _slice_rows(slices: dict[str, dict[str, Any]], limit: int = 25) -> list[list[str]]:
    return [[k, f"{m['docs']:,}", f"{m['tokens']:,}", _f(m["loss"]), _f(m["bits_per_byte"]), _f(m["accuracy"], ".1%")]
            for k, m in list(slices.items())[:limit]]


def build_sections(workdir: Path) -> list[Section]:
    """Everything the report shows, from the files a run leaves in `workdir`."""

    ev = read_json(workdir / "eval.json") if (workdir / "eval.json").is_file() else {}
    sections = [Section("Findings", text=ev.get("findings") or ["No per-document evaluation (no data directory)."]),
                _metrics_section(ev)]
    log_path = workdir / "train_log.jsonl"
    if log_path.is_file():
        log = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if log:
            sections.append(Section("Training loss",
                                    text=[f"{len(log):,} steps, final train loss {log[-1]['loss']:.3f}."],
                                    image="training_loss.png", png=plots.training_curve(log)))
    docs = ev.get("val", {}).get("docs")
    if docs:
        cols = ["slice", "docs", "tokens", "loss", "bits/byte", "accuracy"]
        total = docs["total"]
        sections.append(Section("Val loss per source", headers=["source", *cols[1:]],
                                rows=_slice_rows(docs["by_source"]), image="val_loss_per_source.png",
                                png=plots.loss_per_source(docs["by_source"], total["loss"]),
                                text=["Sources ordered by total loss (nats); the first 25 are listed."]))
        pd = docs["per_doc"]
        sections.append(Section("Loss against length", headers=["length (tokens)", *cols[1:]],
                                rows=_slice_rows(docs["by_length"]), image="loss_vs_length.png",
                                png=plots.loss_vs_length(pd["tokens"], pd["loss"], _edges(docs["by_length"]))))
        bad = Section("Bad cases (val)", headers=["loss", "source", "tokens", "cluster", "near dup in train", "text"])
        for w in docs["worst_cases"]:
            match = (f"yes ({w['train_match']['id']}, J={w['train_match']['jaccard']})"
                     if w["near_duplicate_in_train"] else "no")
            bad.rows.append([_f(w["loss"]), str(w["source"]), str(w["tokens"]), str(w["cluster_id"]), match,
                             w["text"][:100].replace("\n", " ")])
        sections.append(bad)
        leak = [ev[s]["docs"]["leakage"] for s in ("val", "test") if "docs" in ev.get(s, {})]
        sections.append(Section("Leakage", text=[f"{lk['leaked']:,} of {lk['checked']:,} held-out documents "
                                                 f"({lk['rate']:.1%}) have a near duplicate in train." for lk in leak]))
    reg_path = workdir / "regression.json"
    if reg_path.is_file():
        sections.append(_regression_section(read_json(reg_path)))
    gen = ev.get("generation")
    if gen:
        g = Section("Generation checks", headers=["setting", "prompt", "completion", "repetition", "looping"])
        for name in ("greedy", "sampled"):
            g.text.append(f"{name}: distinct-1 {gen[name]['distinct_1']:.2f}, "
                          f"distinct-2 {gen[name]['distinct_2']:.2f}, "
                          f"mean repetition rate {gen[name]['mean_repetition_rate']:.2f}, "
                          f"{gen[name]['looping']} of {len(gen[name]['samples'])} looping.")
            for r in gen[name]["samples"]:
                g.rows.append([name, r["prompt"], r["completion"].replace("\n", " "), _f(r["repetition_rate"], ".2f"),
                               "yes" if r["looping"] else "no"])
        sections.append(g)
    return sections


def _edges(by_length: dict[str, Any]) -> list[int]:
    """Bucket edges back from labels like '<32', '32-127', '>=512'."""
    edges = []
    for k in by_length:
        if k.startswith("<"):
            edges.append(int(k[1:]))
        elif "-" in k:
            edges.append(int(k.split("-")[1]) + 1)
    return sorted(set(edges))


def _regression_section(reg: dict[str, Any]) -> Section:
    s, gate = reg["summary"], reg.get("gate")
    if "rows" in reg:
        sec = Section("Regression set", headers=["case", "expect", "baseline", "new", "delta", "verdict"])
        verdict = "REGRESSED." if s["regressed"] else "no regression."
        sec.text.append(f"Against baseline {s['baseline']}: {s['better']} better, {s['worse']} worse, "
                        f"{s['same']} same (tolerance {s['tolerance']} nats/byte); " + verdict)
        for r in reg["rows"]:
            sec.rows.append([r["id"], r["expect"], _f(r["baseline"]), _f(r["new"]), f"{r['delta']:+.3f}", r["verdict"]])
        if gate:
            sec.text.append(f"Promotion gate for {gate['name']!r} against {gate['baseline_version']}: "
                            + ("promote." if gate["promote"] else f"not promoted ({', '.join(gate['failing'])})."))
        return sec
    sec = Section("Regression set", headers=["case", "expect", "score", "passed"],
                  text=[f"{s['new_passed']} of {s['total']} cases pass; the registry held no model of this name to "
                        f"compare with, so this model is gated on its own cases."])
    for r in reg["new"]["cases"]:
        sec.rows.append([r["id"], r["expect"], _f(r["score"]), "yes" if r["passed"] else "no"])
    return sec


def _md_cell(x: str) -> str:
    return x.replace("|", "\\|").replace("\n", " ")


def render_markdown(sections: list[Section], title: str) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        out += [f"- {t}" if s.title == "Findings" else t for t in s.text] + ([""] if s.text else [])
        if s.image:
            out += [f"![{s.title}]({ASSETS}/{s.image})", ""]
        if s.headers:
            out += ["| " + " | ".join(s.headers) + " |", "|" + "---|" * len(s.headers)]
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in s.rows] + [""]
    return "\n".join(out)


def render_html(sections: list[Section], title: str) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
           "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
           "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
           "th{background:#f3f3f3}img{max-width:100%}</style></head><body>", f"<h1>{e(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        if s.title == "Findings":
            out.append("<ul>" + "".join(f"<li>{e(t)}</li>" for t in s.text) + "</ul>")
        else:
            out += [f"<p>{e(t)}</p>" for t in s.text]
        if s.png:
            out.append(f"<img alt='{e(s.title)}' src='data:image/png;base64,{base64.b64encode(s.png).decode()}'>")
        if s.headers:
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in s.headers) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in s.rows)
                       + "</table>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(workdir: Path, title: str = "tinystack run report") -> dict[str, Any]:
    """Write report.md, report_files/*.png and report.html into workdir; return their paths."""
    sections = build_sections(workdir)
    for s in sections:
        if s.png and s.image:
            with atomic_open(workdir / ASSETS / s.image, "wb") as f:
                f.write(s.png)
    with atomic_open(workdir / "report.md") as f:
        f.write(render_markdown(sections, title))
    with atomic_open(workdir / "report.html") as f:
        f.write(render_html(sections, title))
    return {"markdown": str(workdir / "report.md"), "html": str(workdir / "report.html"),
            "plots": [s.image for s in sections if s.png]}
