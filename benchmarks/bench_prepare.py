"""End-to-end `prepare` throughput and peak memory at 25k / 50k / 100k documents.

    .venv/bin/python benchmarks/bench_prepare.py [--sizes 25000 50000 100000] [--workers 1]
        [--baseline-src DIR]   # e.g. DIR from `git archive <rev> src | tar -x -C /tmp/base`

Corpus: documents of ~1 KB drawn from a Zipf distribution over the 20,000 most
common words of the standard library's docstrings (real vocabulary, every document
distinct), 1,000 sources, with 10 % near-duplicate copies (a few character edits)
and 2 % exact copies planted. Each size runs `prepare` with the default chain
(normalize, length, quality filters, exact + near dedup, source split, leakage
check) in a fresh child process, which reports its own peak RSS (`VmHWM` from
/proc/self/status; `ru_maxrss` would include the benchmark parent's memory, which
Linux carries across exec), so the sizes do not share an allocator. The claim checked: peak memory grows with corpus
size only by about the signature index (n x 128 x 4 bytes + LSH keys and pairs),
not by the corpus. With ``--baseline-src DIR`` each size also runs the `tinystack`
package found in DIR/src (another revision), right after the current one on the same
input, so the two are compared under the same load. Writes
benchmarks/results/prepare.json and prepare.png.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from tinystack.atomic import atomic_open, write_json

RESULTS = Path(__file__).parent / "results"


def vocabulary(n: int = 20_000) -> list[str]:
    from tinystack.data.io.corpus import iter_corpus

    c: Counter[str] = Counter()
    for r in iter_corpus():
        c.update(re.findall(r"[A-Za-z]+", r.text.lower()))
    return [w for w, _ in c.most_common(n)]


def make_corpus(path: Path, n_docs: int, vocab: list[str], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    p /= p.sum()
    n_base = int(n_docs * 0.88)
    words = rng.choice(len(vocab), size=(n_base, 170), p=p)
    with atomic_open(path, "w") as f:
        base_texts = []
        for i in range(n_base):
            t = " ".join(vocab[j] for j in words[i])
            t = ". ".join(s.capitalize() for s in t.split(" the ") if s) + "."
            base_texts.append(t)
            f.write(json.dumps({"text": t, "source": f"site{i % 1000}", "id": i}) + "\n")
        for k in range(n_docs - n_base):
            src = int(rng.integers(n_base))
            t = base_texts[src]
            if k % 6 == 0:  # exact copy (after normalisation)
                copy = t + "  "
            else:
                chars = list(t)
                for pos in rng.integers(len(chars), size=int(rng.integers(1, 15))):
                    chars[pos] = "x"
                copy = "".join(chars)
            f.write(json.dumps({"text": copy, "source": f"site{int(rng.integers(1000))}", "id": n_base + k}) + "\n")


CHILD = """
import json, resource, sys, time


def status_bytes(field):
    # VmHWM / VmRSS of *this* process image. ru_maxrss is not usable here: Linux carries
    # the pre-exec image's high-water mark (the forking benchmark parent, which holds
    # the generated corpus) into the child's ru_maxrss.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


from tinystack.data.pipeline import prepare
before = status_bytes("VmRSS")
t = time.perf_counter()
m = prepare([sys.argv[1]], sys.argv[2], DataConfig(workers=int(sys.argv[3])))
dt = time.perf_counter() - t
near = next(s for s in m["steps"] if s["name"] == "near_dedup")
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": dt, "cpu_seconds": ru.ru_utime + ru.ru_stime,
                  "peak_rss_bytes": status_bytes("VmHWM"), "rss_before_bytes": before,
                  "ru_maxrss_bytes": ru.ru_maxrss * 1024, "records_in": m["records_in"],
                  "records_out": m["records_out"], "dedup_rate": m["dedup_rate"], "leakage": m["leakage"],
                  "clusters": near["extra"]["clusters"], "signatures": near["extra"]["signatures"]}))
"""


def run_child(inp: Path, out: Path, workers: int, pythonpath: Path | None = None) -> dict:
    """`prepare` in a fresh interpreter (optionally importing tinystack from `pythonpath`)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else None
    res = subprocess.run([sys.executable, "-c", CHILD, str(inp), str(out), str(workers)],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[25_000, 50_000, 100_000])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--baseline-src", type=Path, default=None, help="another checkout's root, run side by side")
    args = ap.parse_args()
    vocab = vocabulary()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        for n in args.sizes:
            inp = Path(tmp) / f"corpus{n}.jsonl"
            make_corpus(inp, n, vocab)
            r = run_child(inp, Path(tmp) / f"out{n}", args.workers)
            r.update(docs=n, input_bytes=inp.stat().st_size, docs_per_s=round(n / r["seconds"], 1),
                     docs_per_cpu_s=round(n / r["cpu_seconds"], 1),
                     index_bytes=r["signatures"] * 128 * 4, load_avg_1m=round(os.getloadavg()[0], 2))
            print(f"{n:>7,} docs ({r['input_bytes'] / 1e6:.0f} MB): {r['docs_per_s']:,.0f} docs/s "
                  f"({r['docs_per_cpu_s']:,.0f} per CPU-second), "
                  f"peak RSS {r['peak_rss_bytes'] / 2**20:,.0f} MiB, "
                  f"signature index {r['index_bytes'] / 2**20:.0f} MiB, "
                  f"dedup rate {r['dedup_rate']:.2%}, {r['clusters']:,} clusters, leakage {r['leakage']}, "
                  f"load {r['load_avg_1m']}")
            if args.baseline_src:
                b = run_child(inp, Path(tmp) / f"base{n}", args.workers, args.baseline_src / "src")
                b.update(docs_per_s=round(n / b["seconds"], 1), docs_per_cpu_s=round(n / b["cpu_seconds"], 1))
                r["baseline"] = b
                print(f"{'':>7}   baseline: {b['docs_per_s']:,.0f} docs/s ({b['docs_per_cpu_s']:,.0f} per CPU-second), "
                      f"peak RSS {b['peak_rss_bytes'] / 2**20:,.0f} MiB")
            rows.append(r)
            inp.unlink()
    first, last = rows[0], rows[-1]
    growth = last["peak_rss_bytes"] - first["peak_rss_bytes"]
    summary = {
        "rows": rows, "workers": args.workers, "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
        "rss_growth_bytes": growth, "input_growth_bytes": last["input_bytes"] - first["input_bytes"],
        "index_growth_bytes": last["index_bytes"] - first["index_bytes"],
        "rss_growth_per_extra_doc_bytes": round(growth / (last["docs"] - first["docs"]), 1) if len(rows) > 1 else None,
        "peak_rss_measure": "VmHWM of the child process (its own peak RSS; see module doc)",
    }
    if args.baseline_src and len(rows) > 1:
        bg = last["baseline"]["peak_rss_bytes"] - first["baseline"]["peak_rss_bytes"]
        summary["baseline_src"] = str(args.baseline_src)
        summary["baseline_rss_growth_per_extra_doc_bytes"] = round(bg / (last["docs"] - first["docs"]), 1)
    print(f"peak RSS grew {growth / 2**20:.0f} MiB from {first['docs']:,} to {last['docs']:,} docs "
          f"({summary['rss_growth_per_extra_doc_bytes']} B per extra doc) while the input grew "
          f"{summary['input_growth_bytes'] / 2**20:.0f} MiB")
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "prepare.json", summary)
    from tinystack.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    x = [r["docs"] for r in rows]
    ax[0].plot(x, [r["peak_rss_bytes"] / 2**20 for r in rows], "o-", label="peak RSS")
    ax[0].plot(x, [r["input_bytes"] / 2**20 for r in rows], "s--", label="input size")
    ax[0].plot(x, [r["index_bytes"] / 2**20 for r in rows], "^:", label="signature matrix")
    if args.baseline_src:
        ax[0].plot(x, [r["baseline"]["peak_rss_bytes"] / 2**20 for r in rows], "o--", color="gray",
                   label="peak RSS, baseline")
    ax[0].set(xlabel="documents", ylabel="MiB", title="prepare: memory vs corpus size")
    ax[0].legend()
    labels = [f"{n // 1000}k" for n in x]
    if args.baseline_src:
        pos = np.arange(len(x))
        ax[1].bar(pos - 0.2, [r["docs_per_s"] for r in rows], 0.4, label="current")
        ax[1].bar(pos + 0.2, [r["baseline"]["docs_per_s"] for r in rows], 0.4, color="gray", label="baseline")
        ax[1].set_xticks(pos, labels)
        ax[1].legend()
    else:
        ax[1].bar(labels, [r["docs_per_s"] for r in rows])
    ax[1].set(ylabel="docs/s", title=f"prepare throughput ({args.workers} worker)")
    fig.tight_layout()
    fig.savefig(RESULTS / "prepare.png", dpi=110)


if __name__ == "__main__":
    main()
