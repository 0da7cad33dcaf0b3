"""End-to-end dedup of short documents: `tinystack data dedup` vs a datasketch pipeline.

    .venv/bin/python benchmarks/bench_dedup_short.py [--docs 21000] [--trials 5]

Corpus (bench_dedup_corpus.short_corpus): `--docs` documents of ~330 characters, in
shuffled order: ~40 % English (the stdlib docstrings of the built-in corpus, cut in
pieces), ~50 % Chinese synthesised from charset_normalizer's frequency-ranked list of
common Chinese characters (a Zipf law over a word vocabulary; no download), ~10 %
Chinese mixed with English words; 20 % of the documents are planted copies: exact,
reformatted (Jaccard 1) and edited to a target Jaccard uniform in [0.6, 1.0], some of
them copies of copies. Ground truth: every pair with exact 3-gram Jaccard >= 0.85
(`similar_pairs`, exact) -> its connected components; the documents to remove are all
but the first of each component. Each run's removed set is scored against it.

Timed side by side, trials interleaved, medians reported (wall and process CPU time):

* ``tinystack``: `tools.dedup_files` in process (what `tinystack data dedup` runs),
  reading the JSONL and writing kept.jsonl, duplicates.jsonl and dedup.json;
* ``tinystack_cli``: the CLI as a subprocess, Python start-up and imports included;
* ``datasketch``: `datasketch_dedup` below, the same job written with datasketch as a
  user would: read the JSONL, the same canonical text, exact duplicates by SHA-256,
  3-gram sets, `MinHash.bulk`, `MinHashLSH` insert + query with the banding the dedup
  uses (b=18, r=7: the same candidate recall), candidates verified by exact Jaccard
  >= 0.85, union-find, the same two output files with ``cluster_id``;
* ``datasketch_default_bands``: the same with datasketch's own banding for 0.85
  (b=8, r=16: fewer candidates, lower recall);
* ``datasketch_script``: ``datasketch`` as a subprocess (start-up included), the
  counterpart of ``tinystack_cli``;
* ``tinystack_before`` (with ``--baseline-src DIR``, a ``src`` tree of an earlier commit,
  e.g. ``git archive d740b19 src | tar -x -C DIR``): that code's `dedup_files`, timed
  inside its own process like ``tinystack``.

Records the CPU model and load average: on a shared machine wall-clock ratios move
with other jobs, CPU-time ratios much less. Writes results/dedup_short.json and .png.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench_common import cpu_model
from bench_common import timed as common_timed
from bench_dedup_corpus import short_corpus, similar_pairs
from tinystack.atomic import write_json
from tinystack.data.dedup.near_duplicates import NearDupParams, cluster_roots
from tinystack.data.dedup.shingles import canonical, shingle_set

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
THRESHOLD, PERM = 0.85, 128


def datasketch_dedup(inp: Path, out_dir: Path, bands: tuple[int, int] | None) -> dict:
    """The dedup job with datasketch (see module doc); returns {"removed": [input indices]}."""
    from datasketch import MinHash, MinHashLSH

    with open(inp, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    first: dict[bytes, int] = {}
    firsts = []
    for i, r in enumerate(records):
        firsts.append(first.setdefault(hashlib.sha256(canonical(r["text"], False).encode()).digest(), i))
    rows = [i for i, f in enumerate(firsts) if f == i]
    sets = []
    for i in rows:
        c = canonical(records[i]["text"])
        sets.append({c[k : k + 3] for k in range(len(c) - 2)} if len(c) >= 3 else {c} if c else set())
    mhs = MinHash.bulk([[s.encode("utf-8") for s in x] for x in sets], num_perm=PERM)
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=PERM, params=bands)
    for row, m in enumerate(mhs):
        lsh.insert(row, m)
    parent = list(range(len(records)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for i, f in enumerate(firsts):
        if f != i:
            union(f, i)
    for row, m in enumerate(mhs):
        a = sets[row]
        for other in lsh.query(m):
            if other > row:
                b = sets[other]
                inter = len(a & b)
                union_ = len(a) + len(b) - inter
                if (inter / union_ if union_ else 1.0) >= THRESHOLD:
                    union(rows[row], rows[other])
    roots = [find(i) for i in range(len(records))]
    removed = []
    with open(out_dir / "kept.jsonl", "w", encoding="utf-8") as kept, \
            open(out_dir / "duplicates.jsonl", "w", encoding="utf-8") as dups:
        for i, (r, root) in enumerate(zip(records, roots)):
            (kept if root == i else dups).write(json.dumps({**r, "cluster_id": root}, ensure_ascii=False) + "\n")
            if root != i:
                removed.append(i)
    summary = {"records_in": len(records), "records_out": len(records) - len(removed), "removed": removed}
    (out_dir / "dedup.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "removed"}))
    return summary


def removed_ids(out_dir: Path) -> set[str]:
    with open(out_dir / "duplicates.jsonl", encoding="utf-8") as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def score(removed: set[str], truth: set[str]) -> dict:
    tp = len(removed & truth)
    return {"removed": len(removed), "recall": round(tp / len(truth), 5) if truth else 1.0,
            "precision": round(tp / len(removed), 5) if removed else 1.0}


def timed(fn, *args) -> tuple[float, float]:
    """(wall s, CPU s incl. waited-for children) of fn(*args), or what fn returns when it times itself."""
    run = common_timed(lambda: fn(*args))
    return run.value if isinstance(run.value, tuple) else (run.wall_s, run.cpu_s)


_BEFORE = """import json, sys, time
from tinystack.data.tools import dedup_files
t, c = time.perf_counter(), time.process_time()
dedup_files([sys.argv[1]], sys.argv[2])
print(json.dumps([time.perf_counter() - t, time.process_time() - c]))
"""


def run_before(src: Path, inp: Path, out: Path) -> tuple[float, float]:
    """The earlier code's `dedup_files` in a subprocess, timed inside it (no start-up)."""
    res = subprocess.run([sys.executable, "-c", _BEFORE, str(inp), str(out)], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(src)})
    wall, cpu = json.loads(res.stdout.strip().splitlines()[-1])
    return wall, cpu


def plot(res: dict, path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()
    names = list(res["timing"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, key, title in ((axes[0], "wall_s", "wall time"), (axes[1], "cpu_s", "process CPU time")):
        vals = [res["timing"][n][key] for n in names]
        ax.barh(names, vals, color=["C7" if n == "tinystack_before" else "C0" if n.startswith("tinystack") else "C1"
                                     for n in names])
        ours = res["timing"]["tinystack"][key]
        for y, (n, v) in enumerate(zip(names, vals)):
            runs = res["timing"][n][key.replace("_s", "_runs")]
            ax.plot(runs, [y] * len(runs), "k.", ms=3)
            ax.text(max(runs), y, f"  {v:.2f} s" + (f" ({v / ours:.1f}x)" if n != "tinystack" else ""), va="center")
        ax.invert_yaxis()
        ax.set(title=f"{title}: median of {res['params']['trials']} (dots: trials)", xlabel="seconds")
        ax.set_xlim(0, 1.45 * max(max(res["timing"][n][key.replace("_s", "_runs")]) for n in names))
    s = res["speedup"]
    fig.suptitle(f"dedup of {res['corpus']['docs']:,} short docs (~{res['corpus']['mean_chars']:.0f} chars, en+zh): "
                 f"tinystack {s['wall']:.1f}x datasketch (wall), {s['cpu']:.1f}x (CPU) | {res['machine']['cpu']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=21000)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "dedup_short.json")
    ap.add_argument("--baseline-src", type=Path, help="src/ of an earlier commit: adds tinystack_before")
    ap.add_argument("--datasketch-only", nargs=2, type=Path, metavar=("IN", "OUT_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.datasketch_only:  # the subprocess of the datasketch_script timing
        datasketch_dedup(*args.datasketch_only, NearDupParams().bands)
        return
    from tinystack.data.tools import dedup_files

    texts, langs = short_corpus(args.docs, random.Random(args.seed))
    sets = [shingle_set(t) for t in texts]
    pairs, jac = similar_pairs(sets, THRESHOLD)
    roots = cluster_roots(len(texts), pairs)
    truth = {f"doc{i}" for i in np.flatnonzero(roots != np.arange(len(texts)))}
    corpus = {"docs": len(texts), "mean_chars": round(float(np.mean([len(t) for t in texts])), 1),
              "languages": {k: langs.count(k) for k in sorted(set(langs))},
              "pairs_at_or_above_threshold": int(len(pairs)), "docs_to_remove": len(truth),
              "pairs_by_language": {k: int(sum(langs[i] == k for i in pairs[:, 0].tolist()))
                                    for k in sorted(set(langs))}}
    print(f"corpus: {corpus}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-dedup-short-"))
    inp = tmp / "short.jsonl"
    with open(inp, "w", encoding="utf-8") as f:
        for i, (t, lang) in enumerate(zip(texts, langs)):
            f.write(json.dumps({"text": t, "source": f"site{i % 97}", "id": f"doc{i}", "lang": lang},
                               ensure_ascii=False) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    bands = NearDupParams().bands
    runs = {
        "tinystack": lambda o: dedup_files([inp], o),
        "tinystack_cli": lambda o: subprocess.run(
            [sys.executable, "-m", "tinystack.cli", "data", "dedup", "--input", str(inp), "--out", str(o),
             "--no-progress"], check=True, env=env, stdout=subprocess.DEVNULL),
        "datasketch": lambda o: datasketch_dedup(inp, o, bands),
        "datasketch_default_bands": lambda o: datasketch_dedup(inp, o, None),
        "datasketch_script": lambda o: subprocess.run(
            [sys.executable, __file__, "--datasketch-only", str(inp), str(o)], check=True, env=env),
    }
    if args.baseline_src:
        runs["tinystack_before"] = lambda o: run_before(args.baseline_src.resolve(), inp, o)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    quality = {}
    load = [os.getloadavg()[0]]
    for trial in range(args.trials):
        for name, fn in runs.items():
            out = tmp / f"{name}-{trial}"
            out.mkdir()
            times[name].append(timed(fn, out))
            if trial == 0:
                quality[name] = score(removed_ids(out), truth)
            shutil.rmtree(out)
        print(f"trial {trial}: " + ", ".join(f"{k} {v[-1][0]:.2f}s/{v[-1][1]:.2f}s" for k, v in times.items()))
        load.append(os.getloadavg()[0])
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    timing = {k: {"wall_s": round(w, 3), "cpu_s": round(c, 3), "wall_runs": [round(x[0], 3) for x in times[k]],
                  "cpu_runs": [round(x[1], 3) for x in times[k]], **quality[k]} for k, (w, c) in med.items()}
    ratio = lambda a, b, i: round(med[b][i] / med[a][i], 2) if b in med else None
    res = {
        "corpus": corpus, "timing": timing,
        "speedup": {"wall": ratio("tinystack", "datasketch", 0), "cpu": ratio("tinystack", "datasketch", 1),
                    "wall_vs_default_bands": ratio("tinystack", "datasketch_default_bands", 0),
                    "cpu_vs_default_bands": ratio("tinystack", "datasketch_default_bands", 1),
                    "cli_vs_script_wall": ratio("tinystack_cli", "datasketch_script", 0),
                    "cli_vs_script_cpu": ratio("tinystack_cli", "datasketch_script", 1),
                    "vs_before_wall": ratio("tinystack", "tinystack_before", 0),
                    "vs_before_cpu": ratio("tinystack", "tinystack_before", 1)},
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_avg_1m": [round(x, 2) for x in load],
                    "python": sys.version.split()[0]},
        "params": {**{k: v for k, v in vars(args).items() if k not in ("out", "datasketch_only", "baseline_src")},
                   "baseline_src": bool(args.baseline_src),
                   "threshold": THRESHOLD, "num_perm": PERM, "bands": list(bands)},
    }
    s = res["speedup"]
    for k, v in timing.items():
        print(f"{k:26s} wall {v['wall_s']:6.2f} s  cpu {v['cpu_s']:6.2f} s  removed {v['removed']:5d}  "
              f"recall {v['recall']:.4f}  precision {v['precision']:.4f}")
    print(f"tinystack vs datasketch (same bands): {s['wall']:.2f}x wall, {s['cpu']:.2f}x CPU; vs default bands "
          f"{s['wall_vs_default_bands']:.2f}x / {s['cpu_vs_default_bands']:.2f}x; CLI vs script "
          f"{s['cli_vs_script_wall']:.2f}x / {s['cli_vs_script_cpu']:.2f}x | load {res['machine']['load_avg_1m']}")
    if s["vs_before_cpu"]:
        print(f"tinystack vs the --baseline-src code: {s['vs_before_wall']:.2f}x wall, {s['vs_before_cpu']:.2f}x CPU")
    shutil.rmtree(tmp)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, res)
    plot(res, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
