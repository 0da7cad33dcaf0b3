"""Weight formats: ms per decode pass over all linear layers, weight memory, perplexity, and what auto picks.

Kernel timing uses random weights of the right shapes (SmolLM2-135M: 30 layers, hidden 576,
intermediate 1536, 9 / 3 heads, vocab 49,152, tied head; GPT-2-124M: 12 x 768, vocab 50,257):
one pass = every linear layer of the model once (the head included), at 1 row (batch-1 decode)
and at 16 rows (batched decode). Formats: fp32 and torch's bf16 `F.linear` (bf16 activations),
torch's `_weight_int8pack_mm` (the old INT8 path), and ours (infer/quant: bf16, q8_0, q4_0, q4_1).
Trials interleave the formats (each trial runs every format once, in a shuffled order); the median
is reported, as wall ms and as this process's CPU ms (the machine is shared: CPU time is the
steadier figure under load, wall time what a user sees).
With --model DIR (a Llama/GPT-2 model directory), perplexity and top-1 agreement of each format on
the built-in calibration text, and the format `dtype="auto"` picks there (infer/quant/auto.py).
Writes benchmarks/results/formats.json and formats.png.

    .venv/bin/python benchmarks/bench_formats.py [--trials 9] [--threads 2] [--model DIR]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import RESULTS, finish, machine  # noqa: E402
from tinystack.atomic import write_json  # noqa: E402
from tinystack.infer.quant import kernels  # noqa: E402
from tinystack.infer.quant.formats import FORMATS, quantize  # noqa: E402
from tinystack.infer.quant.linear import head_format  # noqa: E402
from tinystack.kernels import quant as quant_kernels  # noqa: E402


def llama_shapes(hidden, inter, layers, heads, kv_heads, vocab):
    kv = hidden // heads * kv_heads
    block = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
             (hidden, inter)]
    return block * layers + [(vocab, hidden)]


def gpt2_shapes(n_embd=768, layers=12, vocab=50257):
    return [(3 * n_embd, n_embd), (n_embd, n_embd), (4 * n_embd, n_embd), (n_embd, 4 * n_embd)] * layers + \
        [(vocab, n_embd)]


MODELS = {"SmolLM2-135M": llama_shapes(576, 1536, 30, 9, 3, 49152), "GPT-2-124M": gpt2_shapes()}


def runners(shapes, rows: int) -> tuple[dict, dict]:
    """{format: one pass over the layers}, {format: weight bytes}."""
    torch.manual_seed(0)
    ws = [torch.randn(n, k) * 0.02 for n, k in shapes]
    xs = {k: torch.randn(rows, k) for k in {k for _, k in shapes}}
    last = len(ws) - 1
    run, size = {}, {}
    run["fp32"], size["fp32"] = (lambda: [F.linear(xs[w.shape[1]], w) for w in ws]), sum(w.numel() * 4 for w in ws)
    wb = [w.to(torch.bfloat16) for w in ws]
    xb = {k: v.bfloat16() for k, v in xs.items()}
    run["torch bf16"], size["torch bf16"] = (lambda: [F.linear(xb[w.shape[1]], w) for w in wb]), size["fp32"] // 2
    i8 = []
    for w in ws:
        s = (w.abs().amax(1) / 127).clamp(min=1e-12)
        i8.append((torch.round(w / s[:, None]).to(torch.int8), s))
    run["torch int8pack"] = lambda: [torch._weight_int8pack_mm(xs[q.shape[1]], q, s) for q, s in i8]
    size["torch int8pack"] = sum(q.numel() + s.numel() * 4 for q, s in i8)
    for fmt in FORMATS:
        packs = [quantize(w, head_format(fmt) if i == last else fmt) for i, w in enumerate(ws)]
        run[fmt] = (lambda packs=packs: [kernels.matmul(xs[p.in_features], p) for p in packs])
        size[fmt] = sum(p.nbytes for p in packs)
    return run, size


def time_interleaved(run: dict, trials: int) -> dict:
    for f in run.values():
        f()  # warm-up
    wall = {k: [] for k in run}
    cpu = {k: [] for k in run}
    order = list(run)
    for t in range(trials):
        random.Random(t).shuffle(order)
        for k in order:
            w0, c0 = time.perf_counter(), time.process_time()
            run[k]()
            wall[k].append((time.perf_counter() - w0) * 1e3)
            cpu[k].append((time.process_time() - c0) * 1e3)
    return {k: {"wall_ms": statistics.median(wall[k]), "cpu_ms": statistics.median(cpu[k]),
                "wall_ms_min": min(wall[k])} for k in run}


def quality(model_dir: Path) -> dict:
    from tinystack.infer.quant.auto import calibration_ids, measure
    from tinystack.model import load_model
    from tinystack.tokenizer import load_tokenizer

    model = load_model(model_dir)
    ids = calibration_ids(load_tokenizer(model_dir), model.config.max_seq_len)
    choice = measure(model, ids, score_all=True)
    return {"model_dir": str(model_dir), "tokens": choice.tokens, "ppl": choice.ppl, "top1_agreement": choice.agreement,
            "auto_ms_per_pass": choice.ms, "auto_choice": choice.format, "auto_summary": choice.summary()}


def plot(res: dict, path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()
    panels = [(m, r) for m in res["models"] for r in res["models"][m]["timings"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (m, r) in zip(axes[0], panels):
        t = res["models"][m]["timings"][r]
        names = list(t)
        ax.barh(names, [t[n]["wall_ms"] for n in names], color="#9ab", label="wall ms")
        ax.barh(names, [t[n]["cpu_ms"] for n in names], color="#369", height=0.4, label="CPU ms")
        for i, n in enumerate(names):
            ax.text(t[n]["cpu_ms"], i, f" {t[n]['cpu_ms']:.1f}", va="center", fontsize=7)
        ax.set_xscale("log")
        ax.set_title(f"{m}, {r}", fontsize=9)
        ax.set_xlabel("ms per pass over all linear layers (log)")
        ax.invert_yaxis()
    axes[0][0].legend(fontsize=8)
    m = res["machine"]
    fig.suptitle(f"weight formats on {m['cpu_model']} (load {m['loadavg_at_start'][0]:.1f})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--model", type=Path, default=None, help="a model directory for perplexity and auto's choice")
    ap.add_argument("--out", type=Path, default=RESULTS / "formats.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {"machine": machine(), "kernel_path": quant_kernels.default_path(), "models": {}}
    for name, shapes in MODELS.items():
        entry = res["models"][name] = {"matrices": len(shapes), "timings": {}}
        for rows in map(int, args.rows.split(",")):
            run, size = runners(shapes, rows)
            entry["weight_mib"] = {k: v / 2**20 for k, v in size.items()}
            t = entry["timings"][f"{rows} row{'s' * (rows > 1)}"] = time_interleaved(run, args.trials)
            for k, v in t.items():
                print(f"{name:13s} rows={rows:2d} {k:15s} {v['wall_ms']:8.2f} ms wall {v['cpu_ms']:8.2f} ms CPU "
                      f"{entry['weight_mib'][k]:7.1f} MiB", flush=True)
    if args.model:
        res["quality"] = quality(args.model)
        print(res["quality"]["auto_summary"])
    write_json(args.out, finish(res))
    plot(res, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
