"""Importing the packaged SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) as a float32 model directory (538 MB).

- end to end: `tinystack model import smollm2-135m-instruct --out DIR` in a child process: wall time
  and the child's own peak RSS (os.wait4's rusage, so nothing of this process counts)
- baseline: a child that only imports what the command imports (torch, tokenizers, gguf, ...): the
  part of the peak that is not the import's
- stages, in one child: open the GGUF (gguf.GGUFReader parses the metadata), rebuild the tokenizer,
  dequantise every tensor (ours, gguf_dequant.py), and the whole import with its write
- reference: `transformers` loading the same GGUF (AutoModelForCausalLM.from_pretrained(gguf_file=...)),
  which dequantises with gguf.quants, in a child: wall time and peak RSS
Writes benchmarks/results/import.json.

    .venv/bin/python benchmarks/bench_import.py [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_common import machine  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
NAME = "smollm2-135m-instruct"

STAGES = r"""
import json, sys, time, resource
t0 = time.perf_counter()
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
out = {}
def mark(name, t):
    out[name] = {"s": round(time.perf_counter() - t, 3), "rss_mib": round(rss(), 1),
                 "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
import torch, tokenizers, gguf, safetensors
from tinystack.model.importer import import_model, resolve_source
from tinystack.model.gguf_model import GGUFModel
from tinystack.model.gguf_tokenizer import build_tokenizer
mark("imports", t0)
path, _ = resolve_source(sys.argv[1]); t = time.perf_counter(); g = GGUFModel(path); mark("open_gguf", t)
t = time.perf_counter(); build_tokenizer(g.metadata); mark("tokenizer", t)
t = time.perf_counter(); n = sum(w.size for _, w in g.tensors()); mark("dequantise_all", t)
out["dequantise_all"]["values_per_s"] = round(n / out["dequantise_all"]["s"])
del g
t = time.perf_counter(); import_model(sys.argv[1], sys.argv[2]); mark("import_model", t)
print(json.dumps(out))
"""
BASELINE = "import torch, tokenizers, gguf, safetensors, tinystack.cli, tinystack.model.importer"
REFERENCE = r"""
import sys, time, torch
from transformers import AutoModelForCausalLM
from tinystack.model.importer import resolve_source
path, _ = resolve_source(sys.argv[1])
t = time.perf_counter()
AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
print(time.perf_counter() - t)
"""


def run_child(args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, the child's peak RSS in MiB, its stdout)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TQDM_DISABLE": "1"}
    with tempfile.TemporaryFile("w+") as out:
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode:
        raise SystemExit(f"child {args[:3]} failed with {proc.returncode}: {text[-500:]}")
    return wall, usage.ru_maxrss / 1024, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "import.json")
    args = ap.parse_args()
    res: dict = {"source": NAME, "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        walls, peaks = [], []
        for i in range(args.trials):
            wall, peak, _ = run_child(["-m", "tinystack", "model", "import", NAME, "--out", f"{tmp}/m{i}"])
            walls.append(wall)
            peaks.append(peak)
            print(f"import {i + 1}/{args.trials}: {wall:.1f} s, peak RSS {peak:.0f} MiB", flush=True)
        out = Path(tmp) / "m0"
        lineage = json.loads((out / "tinystack.json").read_text())["source"]
        res["import"] = {"wall_s": walls, "wall_s_median": statistics.median(walls), "peak_rss_mib": peaks,
                         "source_bytes": lineage["bytes"], "tensor_types": lineage["tensor_types"],
                         "output_bytes": sum(f.stat().st_size for f in out.iterdir())}
        _, base, _ = run_child(["-c", BASELINE])
        res["baseline_peak_rss_mib"] = base
        print(f"baseline (imports only): peak RSS {base:.0f} MiB", flush=True)
        _, _, stages = run_child(["-c", STAGES, NAME, f"{tmp}/stages"])
        res["stages"] = json.loads(stages)
        print(json.dumps(res["stages"], indent=1), flush=True)
        wall, peak, text = run_child(["-c", REFERENCE, NAME])
        load_s = float(text.strip().splitlines()[-1])
        res["transformers_gguf_load"] = {"wall_s": wall, "load_s": load_s, "peak_rss_mib": peak}
        print(f"transformers from_pretrained(gguf_file=...): {load_s:.1f} s in a {wall:.1f} s child, "
              f"peak RSS {peak:.0f} MiB", flush=True)
    res["machine"]["loadavg_at_end"] = os.getloadavg()
    from tinystack.atomic import write_json

    write_json(args.out, res)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
