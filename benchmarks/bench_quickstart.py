"""Benchmark the README's quick start as a newcomer meets it: `git clone` into a fresh directory, then
`make demo` and `make test`, each timed (wall clock, its own install step included), with the exit codes.

    python3 benchmarks/bench_quickstart.py [--demo-args "--config configs/smoke.toml"] [--skip-test]

It clones the committed HEAD (uncommitted changes are not in a clone), so the figure is that commit's. The
clone has its own .venv and runs/; shared with this machine are pip's cache and ~/.cache (compiled kernels,
weight-format decisions): delete those first to time a first-ever run. Writes
benchmarks/results/quickstart.json. Needs `make`, git and the package index.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, ROOT, finish, machine  # noqa: E402


def timed_make(target: str, cwd: Path, args: str = "") -> dict:
    t0 = time.perf_counter()
    cmd = ["make", target] + ([f"ARGS={args}"] if args else [])
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return {"command": " ".join(cmd), "wall_s": round(time.perf_counter() - t0, 1), "returncode": proc.returncode,
            "tail": tail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-args", default="", help='ARGS for make demo, e.g. "--config configs/smoke.toml"')
    ap.add_argument("--skip-test", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "quickstart.json")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res = {"benchmark": "quickstart", "commit": commit, "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "tinystack"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        res["demo"] = timed_make("demo", clone, args.demo_args)
        print(f"make demo: {res['demo']['wall_s']:.0f} s, exit {res['demo']['returncode']}", flush=True)
        if not args.skip_test:
            res["test"] = timed_make("test", clone)
            print(f"make test: {res['test']['wall_s']:.0f} s, exit {res['test']['returncode']}: "
                  f"{res['test']['tail'][-1] if res['test']['tail'] else ''}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(finish(res), indent=2) + "\n")


if __name__ == "__main__":
    main()
