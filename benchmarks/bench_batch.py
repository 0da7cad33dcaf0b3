"""Batch size vs decode latency and throughput (batch 1-64), and batch-1 decode vs the memory-bandwidth limit.

B requests of a 128-token prompt decode 32 tokens together on our continuous-batching
engine (GPT-2-124M shape, float32); after the prefill step, each decode step's wall time
is the per-token latency and B / latency the throughput. While decode is memory-bound,
the weights are read once per step whatever B is, so throughput grows ~linearly in B;
where the curve bends is where compute takes over. Batch-1 decode is compared with the
bound  weight bytes per token / measured read bandwidth  (a 1 GiB float32 sum, best of 5,
in 2 MiB pages like the engine's weights; the 4 KiB-page figure is recorded beside it).
Step times are CPU seconds of this process with one torch thread (the machine is shared;
see bench_infer_common.timed). Writes benchmarks/results/batch.json and batch.png.

    .venv/bin/python benchmarks/bench_batch.py [--threads 1] [--batches 1,2,4,8,16,32,64] [--new 32]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine  # noqa: E402
from bench_infer_common import IdTokenizer, gpt2_124m, random_prompt  # noqa: E402
from tinystack.atomic import atomic_open, write_json  # noqa: E402
from tinystack.config import InferConfig
from tinystack.infer import LLMEngine, SamplingParams  # noqa: E402
from tinystack.infer.weight_arena import hugepage_empty  # noqa: E402

PROMPT = 128


def read_bandwidth(gib: float = 1.0, repeat: int = 5, hugepages: bool = True) -> float:
    """Bytes/s of a float32 sum over `gib` GiB, in the 2 MiB pages the engine's weights use (or 4 KiB pages)."""
    x = hugepage_empty(int(gib * 2**30), hugepages).view(torch.float32).fill_(1.0)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        x.sum()
        best = min(best, time.process_time() - t0)
    return x.numel() * 4 / best


def decode_steps(model, B: int, new: int) -> list[float]:
    engine = LLMEngine(model, IdTokenizer(), InferConfig(kv_cache="paged", max_num_seqs=B,
                                                         max_num_batched_tokens=B * PROMPT))
    for i in range(B):
        engine.add_request(f"r{i}", random_prompt(PROMPT, seed=i), SamplingParams(temperature=0, max_tokens=new,
                                                                                 ignore_eos=True))
    engine.step()  # the whole batch's prefill in one step
    times = []
    while engine.has_unfinished():
        t0 = time.process_time()  # CPU seconds: the machine is shared (bench_infer_common.timed)
        engine.step()
        times.append(time.process_time() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--out", type=Path, default=RESULTS / "batch.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = gpt2_124m()
    decode_steps(model, 1, 4)  # warm-up
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        times = decode_steps(model, B, args.new)
        lat = statistics.median(times)
        rows.append({"batch": B, "step_latency_s": lat, "tokens_per_s": B / lat})
        print(f"batch {B:3d}: {lat * 1e3:8.1f} ms/step, {B / lat:8.1f} tokens/s", flush=True)
    weight_bytes = sum(p.numel() * 4 for p in {id(p): p for p in model.parameters()}.values())
    kv_bytes = 2 * 12 * 768 * 4 * (PROMPT + args.new // 2)  # mean KV read per batch-1 step
    bw, bw_4k = read_bandwidth(), read_bandwidth(hugepages=False)
    b1 = rows[0]["step_latency_s"] if rows[0]["batch"] == 1 else None
    roofline = {"weight_bytes": weight_bytes, "kv_bytes_per_step": kv_bytes, "read_bandwidth_bytes_per_s": bw,
                "read_bandwidth_4k_pages_bytes_per_s": bw_4k,
                "bound_step_s": (weight_bytes + kv_bytes) / bw}
    if b1:
        roofline["batch1_step_s"] = b1
        roofline["fraction_of_bandwidth_limit"] = roofline["bound_step_s"] / b1
        print(f"read bandwidth {bw / 1e9:.1f} GB/s (4 KiB pages: {bw_4k / 1e9:.1f}); "
              f"weights {weight_bytes / 1e6:.0f} MB -> bound "
              f"{roofline['bound_step_s'] * 1e3:.1f} ms/token; batch-1 decode {b1 * 1e3:.1f} ms/token = "
              f"{roofline['fraction_of_bandwidth_limit']:.0%} of the bandwidth limit")
    res = finish({"model": "GPT-2-124M shape, random weights, float32", "prompt_tokens": PROMPT, "new_tokens": args.new,
                  "machine": machine(), "rows": rows, "roofline": roofline})
    write_json(args.out, res)
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


def plot(rows: list[dict], path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()

    x = [r["batch"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(x, [r["step_latency_s"] * 1e3 for r in rows], "o-")
    ax[0].set(xscale="log", xlabel="batch size", ylabel="ms per decode step", title="latency")
    ax[1].plot(x, [r["tokens_per_s"] for r in rows], "o-", label="measured")
    ax[1].plot(x, [rows[0]["tokens_per_s"] * b / x[0] for b in x], ":", color="gray", label="linear (memory-bound)")
    ax[1].set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens / s", title="throughput")
    ax[1].legend()
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


if __name__ == "__main__":
    main()
