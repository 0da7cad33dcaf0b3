"""What 2 MiB pages are worth to a batch-1 decode step (GPT-2-124M shape, random weights, float32).

Two copies of the same model, placed by `infer.weight_arena.place_weights` with and without
huge pages (both with the column-major head), each with its own contiguous KV cache. Then
`--rounds` rounds of one decode step at position `--pos` through each, in a shuffled order
every round so the neighbours' load hits both alike. Reports the step-time distribution
(min / median / p90), the weights streamed per second, and the same logits from both.
Writes benchmarks/results/hugepages.json and hugepages.png (the two distributions).

    .venv/bin/python benchmarks/bench_hugepages.py [--rounds 60] [--pos 192] [--threads 1]
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine  # noqa: E402
from bench_infer_common import gpt2_124m  # noqa: E402
from tinystack.atomic import atomic_open, write_json  # noqa: E402
from tinystack.infer.paged_cache import BatchView, KVStorage  # noqa: E402
from tinystack.infer.weight_arena import hugepages_available, place_weights  # noqa: E402


def decode_step(model, storage: KVStorage, pos: int):
    """One token at position `pos` of one sequence, through the engine's own cache view."""
    @torch.inference_mode()
    def step() -> torch.Tensor:
        view = BatchView(storage, [[0]], [pos], [1], torch.device("cpu"))
        return model(torch.tensor([[5]]), kv_cache=view, positions=view.positions, logit_index=view.last_index)[0]
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--pos", type=int, default=192, help="decode position (keys attended)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS / "hugepages.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = gpt2_124m()
    model.eval()
    plain = copy.deepcopy(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    steps = {}
    for name, m, huge in (("2MiB_pages", model, True), ("4KiB_pages", plain, False)):
        report = place_weights(m, hugepages=huge)
        print(report, flush=True)
        storage = KVStorage(cfg.n_layer, 1, cfg.max_seq_len, cfg.n_kv_head, cfg.head_dim, hugepages=huge)
        steps[name] = decode_step(m, storage, args.pos)
    same = torch.equal(steps["2MiB_pages"](), steps["4KiB_pages"]())
    ms: dict[str, list[float]] = {k: [] for k in steps}
    order = random.Random(0)
    for _ in range(args.rounds):
        for name in order.sample(list(steps), len(steps)):
            t = time.perf_counter()
            steps[name]()
            ms[name].append((time.perf_counter() - t) * 1e3)
    res = {"model": "GPT-2-124M shape, random weights, float32", "machine": machine(), "rounds": args.rounds,
           "position": args.pos, "weight_bytes": weight_bytes, "hugepages_available": hugepages_available(),
           "same_logits": same, "step_ms": ms}
    for name, v in ms.items():
        s = sorted(v)
        med = statistics.median(s)
        res[name] = {"min_ms": s[0], "median_ms": med, "p90_ms": s[int(0.9 * (len(s) - 1))],
                     "weights_gb_per_s": weight_bytes / med / 1e6}
        print(f"{name}: decode step min {s[0]:.1f} ms, median {med:.1f} ms, p90 {res[name]['p90_ms']:.1f} ms "
              f"({res[name]['weights_gb_per_s']:.1f} GB/s of weights)", flush=True)
    res["median_speedup"] = res["4KiB_pages"]["median_ms"] / res["2MiB_pages"]["median_ms"]
    print(f"2 MiB pages: {res['median_speedup']:.2f}x faster decode step by medians (same logits: {same})")
    write_json(args.out, finish(res))
    plot(ms, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


def plot(ms: dict[str, list[float]], path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 3.5))
    hi = max(max(v) for v in ms.values())
    bins = [i * hi / 40 for i in range(41)]
    for name, v in ms.items():
        ax.hist(v, bins=bins, alpha=0.6, label=f"{name.replace('_', ' ')} (median {statistics.median(v):.1f} ms)")
    ax.set_xlabel("batch-1 decode step, GPT-2-124M float32, 1 thread (ms)")
    ax.set_ylabel("steps")
    ax.set_title("Weights and KV cache in 2 MiB vs 4 KiB pages (interleaved)")
    ax.legend()
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
