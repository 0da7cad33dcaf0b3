"""A SmolLM2-135M fine-tuning step's products: one library call vs rows split over the threads (kernels/matmul_plan.py).

For every large product of a step at `--batch` x 256 tokens in bf16 (each projection's forward x W^T, its input's
gradient g W and its weight's gradient g^T x; q/k/v and gate/up fused as the trainer runs them), on random
operands of the step's shapes and layouts: torch.mm and linear_ops.cpp's rows_mm, alternating for `--rounds`
rounds, median time of each; and the way matmul_plan plans it in this process (its own shorter probe). Prints a
table, writes results/matmul_plan.json. Reads no model: the shapes are SmolLM2's (hidden 576, 9 + 2 x 3 heads
of 64, MLP 1536).

    .venv/bin/python benchmarks/bench_matmul_plan.py [--batch 4] [--rounds 15] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, cpu_model, finish, machine
from tinystack.atomic import write_json
from tinystack.train import matmul_plan

HIDDEN, QKV, MLP = 576, 576 + 2 * 192, 1536
LAYERS = {"qkv_proj": (HIDDEN, QKV), "o_proj": (HIDDEN, HIDDEN), "gate_up_proj": (HIDDEN, 2 * MLP),
          "down_proj": (MLP, HIDDEN)}  # name: (in, out)


def products(tokens: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, a, b) for a @ b: each layer's three products, operands laid out as PlannedLinear passes them."""
    out = []
    for name, (fan_in, fan_out) in LAYERS.items():
        x = torch.randn(tokens, fan_in, dtype=torch.bfloat16)
        w = torch.randn(fan_out, fan_in, dtype=torch.bfloat16)
        g = torch.randn(tokens, fan_out, dtype=torch.bfloat16)
        out += [(f"{name} forward x W^T", x, w.t()), (f"{name} grad_x g W", g, w),
                (f"{name} grad_W g^T x", g.t(), x)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--out", type=Path, default=RESULTS / "matmul_plan.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = matmul_plan.linear_ops()
    if ops is None:
        raise SystemExit("bench_matmul_plan: needs the C++ extension (a C++ compiler)")
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    rows = []
    print(f"{cpu_model()}, {threads} threads, {args.batch} x {args.seq} tokens, bf16")
    for label, a, b in products(args.batch * args.seq):
        ways = {"one call": lambda a=a, b=b: torch.mm(a, b),
                "rows split": lambda a=a, b=b: ops.rows_mm(a, b, threads)}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(2):
            for way in ways.values():
                way()
        for _ in range(args.rounds):
            for k, way in ways.items():
                t0 = time.perf_counter()
                way()
                times[k].append(time.perf_counter() - t0)
        one, split = (statistics.median(times[k]) * 1e3 for k in ways)
        flop = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        planned = matmul_plan.row_parts(a, b)
        rows.append({"product": label, "shape": [*a.shape, b.shape[1]], "one_call_ms": one, "rows_split_ms": split,
                     "split_speedup": one / split, "planned_parts": planned,
                     "one_call_gflops": flop / one / 1e6, "rows_split_gflops": flop / split / 1e6})
        print(f"{label:26s} [{a.shape[0]:5d}, {a.shape[1]:5d}] @ [{b.shape[0]:5d}, {b.shape[1]:5d}]  one call "
              f"{one:6.2f} ms  rows split {split:6.2f} ms  {one / split:4.2f}x  planned: "
              f"{'split' if planned > 1 else 'one call'}")
    best = sum(min(r["one_call_ms"], r["rows_split_ms"]) for r in rows)
    planned_ms = sum(r["rows_split_ms"] if r["planned_parts"] > 1 else r["one_call_ms"] for r in rows)
    one_ms = sum(r["one_call_ms"] for r in rows)
    print(f"a layer's products: one call each {one_ms:.1f} ms, as planned {planned_ms:.1f} ms, best of the two "
          f"{best:.1f} ms")
    write_json(args.out, finish({"machine": machine(), "batch": args.batch, "seq": args.seq, "threads": threads,
                                 "rounds": args.rounds, "products": rows, "layer_one_call_ms": one_ms,
                                 "layer_planned_ms": planned_ms, "layer_best_ms": best}))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
