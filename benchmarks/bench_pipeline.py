"""Benchmark the main job: wall time of `tinystack run` per stage, and what the model reached.

The foundation's targets: `--config configs/smoke.toml` finishes in under a minute (CI),
and the default config trains in a few minutes on 2 CPU cores. Runs the real CLI in a
fresh work directory (server demo included), then reads the per-stage seconds from
`stages.json` and the metrics from `eval.json`. Writes benchmarks/results/pipeline_<config>.json.

    .venv/bin/python benchmarks/bench_pipeline.py [--config configs/smoke.toml]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tinystack.atomic import write_json

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "smoke.toml")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "run"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tinystack", "run", "--config", str(args.config),
                               "--workdir", str(workdir)], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"tinystack run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        stages = json.loads((workdir / "stages.json").read_text())
        evaluation = json.loads((workdir / "eval.json").read_text())
        demo = [json.loads(line) for line in (workdir / "logs" / "requests.jsonl").read_text().splitlines()]
    train = stages["train"]["info"]
    result = {
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
        "wall_s": round(wall, 2),
        "stage_s": {name: s["info"]["seconds"] for name, s in stages.items()},
        "train_tokens_per_s": round(train["tokens_per_s"], 1),
        "train_steps": train["steps"],
        "final_train_loss": round(train["final_train_loss"], 4),
        "val": {k: round(v, 4) for k, v in evaluation["val"].items() if isinstance(v, float)},
        "test": {k: round(v, 4) for k, v in evaluation["test"].items() if isinstance(v, float)},
        "demo_requests": len([d for d in demo if d.get("status") == 200]),
        "demo_total_ms_max": max((d["total_ms"] for d in demo if "total_ms" in d), default=None),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "processor": platform.machine()},
    }
    out = ROOT / "benchmarks" / "results" / f"pipeline_{args.config.stem}.json"
    write_json(out, result)
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
