"""Benchmark: NumPy GPT (hand-written backward) vs the PyTorch backend, training tokens/s on the shakespeare config.

Both backends train the same model (configs/shakespeare-char.toml: 4 layers, 4 heads,
128 embd, context 64, batch 12) from the same initial weights on the same batches for
--steps steps, float32, in one process and alternating, so they see the same load.
Also reports how far their losses drift apart in float32 (in float64 the tests hold
them within 1e-5 over 10 steps).

    .venv/bin/python benchmarks/bench_numpy_gpt.py [--steps 30] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import sys

_threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = _threads  # BLAS threads are fixed when NumPy loads its library

import json  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from tinystack.atomic import write_json  # noqa: E402
from tinystack.config import load_config  # noqa: E402
from tinystack.model.gpt import GPTConfig  # noqa: E402
from tinystack.train import train  # noqa: E402
from tinystack.train.numpy_loop import train_numpy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_train_shakespeare import DATA, load_split  # noqa: E402


def _losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs/shakespeare-char.toml")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/numpy_gpt.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [f"train.max_iters={args.steps}"])
    tok, train_ids, _ = load_split(DATA)
    m = cfg.model
    gcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout)
    load = os.getloadavg()
    runs: dict[str, list[float]] = {"numpy": [], "torch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _rep in range(2):
            for name, fn in (("numpy", train_numpy), ("torch", train)):
                log = Path(tmp) / f"{name}.jsonl"
                _, result = fn(gcfg, train_ids, None, cfg.train, log_path=log, progress=False)
                runs[name].append(result.tokens_per_s)
        drift = max(abs(a - b) for a, b in zip(_losses(Path(tmp) / "numpy.jsonl"), _losses(Path(tmp) / "torch.jsonl")))
    np_tps, torch_tps = max(runs["numpy"]), max(runs["torch"])
    out = {"config": str(args.config.relative_to(ROOT)), "steps": args.steps, "threads": args.threads,
           "tokens_per_step": cfg.train.batch_size * m.block_size, "numpy_tokens_per_s": round(np_tps, 1),
           "torch_tokens_per_s": round(torch_tps, 1), "numpy_over_torch": round(np_tps / torch_tps, 3),
           "max_float32_loss_drift": drift, "all_runs": runs, "loadavg": [round(v, 2) for v in load],
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"}
    write_json(args.out, out)
    print(f"NumPy GPT {np_tps:,.0f} tokens/s vs PyTorch {torch_tps:,.0f} tokens/s: {np_tps / torch_tps:.2f}x "
          f"({args.steps} steps, {args.threads} thread(s), load {load[0]:.1f}); max float32 loss drift {drift:.2e} "
          f"-> {args.out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
