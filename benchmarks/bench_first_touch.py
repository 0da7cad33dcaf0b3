"""What a fresh engine's first requests pay to fault in KV-cache pages: SmolLM2-135M-Instruct, rounds of
`--concurrent` requests through `LLM.generate`, once the engine is ready as the server takes it to be
(`LLMEngine.wait_for_kv_pages`).

The KV storage is one slab per (layer, K/V head) in 2 MiB pages (infer/paged_cache.py), so the first block a
sequence takes in a part of the storage no block has used yet faults in one fresh page in every slab (180 for
SmolLM2). Three arms: the engine as it is ("now": sequences packed at the low end of the storage, whose first
pages a background thread faulted in when the storage was made), the same without that thread ("no prefault"),
and the engine before either ("middle": a new sequence started in the middle of the largest free run). Each arm
runs in a process of its own (a fresh engine, a fresh mapping), the arms' order rotating over `--trials`; per
round: wall time, the process's system CPU time (the kernel zeroing pages) and the 2 MiB pages the OS handed out
(`thp_fault_alloc` in /proc/vmstat: machine-wide, so run it on an idle machine). Writes
benchmarks/results/first_touch.json.

    .venv/bin/python benchmarks/bench_first_touch.py [--trials 3] [--rounds 3] [--concurrent 8]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402

ARMS = ("now", "no prefault", "middle")


def thp_faults() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_alloc "):
            return int(line.split()[1])
    return -1


def run_arm(arm: str, model_dir: str, rounds: int, concurrent: int) -> list[dict]:
    """In this process: a fresh engine, then `rounds` rounds of `concurrent` new requests (64 tokens each)."""
    from tinystack.infer import LLM, SamplingParams, paged_cache
    from tinystack.infer.block_manager import BlockManager

    if arm != "now":
        paged_cache._prefault_first_pages = lambda *stores: None
    if arm == "middle":  # the rule before: every live sequence reaches to the end of the storage, so a new one
        # starts in the middle of the largest free run whenever a live sequence precedes it
        BlockManager._mark_tail = lambda self, seq: self.tails.__setitem__(seq.block_table[-1], self.num_blocks)
    llm = LLM(model_dir)
    llm.engine.wait_for_kv_pages()  # as the server does before it takes requests (a no-op without the prefault)
    out = []
    for r in range(rounds):
        prompts = [f"Request {r}-{i}: tell me a long story about a dragon and a knight. " * 10
                   for i in range(concurrent)]
        u0, f0, t0 = resource.getrusage(resource.RUSAGE_SELF), thp_faults(), time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
        wall, u1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        out.append({"round": r, "wall_s": wall, "system_s": u1.ru_stime - u0.ru_stime,
                    "huge_pages_faulted": thp_faults() - f0})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--model", help="a SmolLM2 model directory (default: imported from the packaged GGUF)")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a worker process's arm
    ap.add_argument("--out", type=Path, default=RESULTS / "first_touch.json")
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.model, args.rounds, args.concurrent)))
        return
    res = {"machine": machine(), "concurrent": args.concurrent, "max_tokens": 64, "arms": {a: [] for a in ARMS}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from tinystack.model.importer import import_model
            model_dir = str(Path(tmp) / "smollm2")
            import_model("smollm2-135m-instruct", model_dir)
        for t in range(args.trials):
            for arm in ARMS[t % len(ARMS):] + ARMS[:t % len(ARMS)]:
                cmd = [sys.executable, __file__, "--arm", arm, "--model", model_dir, "--rounds", str(args.rounds),
                       "--concurrent", str(args.concurrent)]
                rounds = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                res["arms"][arm].append(rounds)
                print(f"trial {t} {arm}: " + "; ".join(
                    f"round {r['round']} {r['wall_s']:.2f} s wall, {r['system_s']:.2f} s system, "
                    f"{r['huge_pages_faulted']} huge pages" for r in rounds))
    for arm in ARMS:
        first = [trial[0] for trial in res["arms"][arm]]
        later = [r for trial in res["arms"][arm] for r in trial[1:]]
        res[arm] = {key: {"first_round": statistics.median(r[key] for r in first),
                          "later_rounds": statistics.median(r[key] for r in later) if later else None}
                    for key in ("wall_s", "system_s", "huge_pages_faulted")}
        print(f"{arm}: first round {res[arm]['wall_s']['first_round']:.2f} s "
              f"({res[arm]['system_s']['first_round']:.2f} s system, "
              f"{res[arm]['huge_pages_faulted']['first_round']} huge pages), later rounds "
              f"{res[arm]['wall_s']['later_rounds']:.2f} s ({res[arm]['system_s']['later_rounds']:.2f} s system, "
              f"{res[arm]['huge_pages_faulted']['later_rounds']} huge pages)")
    write_json(args.out, finish(res))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
