"""Benchmark: one epoch of the NumPy MLP over MNIST-shaped data, side by side with PyTorch; digits accuracy.

One epoch = 60,000 x 784 float32 rows (MNIST's training set shape; real MNIST with
--mnist DIR holding the IDX files, else seeded random pixels), batch 128, MLP
784-256-10 with ReLU, AdamW + clipping + the shared schedule (`nn.classify.fit`).
The same epoch with torch.nn + torch.optim.AdamW runs in the same process, so the
ratio is measured under the same machine load. Target: NumPy epoch <= 5 s.
Also trains the NumPy MLP on scikit-learn's bundled digits and reports test accuracy (target >= 97%).

    .venv/bin/python benchmarks/bench_mlp.py [--threads 1] [--mnist DIR] [--hidden 256]
"""
from __future__ import annotations

import argparse
import os
import sys

# BLAS threads must be fixed before NumPy loads its library
_threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = _threads

import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tinystack.atomic import write_json  # noqa: E402
from tinystack.nn import MLP  # noqa: E402
from tinystack.nn.classify import accuracy, fit  # noqa: E402
from tinystack.nn.datasets import load_digits, load_mnist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def torch_epoch(x: np.ndarray, y: np.ndarray, hidden: int, batch: int, seed: int = 0) -> float:
    """Seconds for the same epoch in PyTorch: same shapes, AdamW, clipping, per-step lr, shuffled batches."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    t0 = time.perf_counter()
    for i in range(0, len(x), batch):
        rows = order[i:i + batch]
        loss = torch.nn.functional.cross_entropy(model(xt[rows]), yt[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = 3e-3
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mnist", type=Path, default=None)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/mlp.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.mnist:
        x, y, x_te, y_te = load_mnist(args.mnist)
        data = "MNIST"
    else:
        rng = np.random.default_rng(0)
        x = (rng.integers(0, 256, (60_000, 784)) / 255.0).astype(np.float32)
        y = rng.integers(0, 10, 60_000).astype(np.int64)
        data = "random MNIST-shaped (60000 x 784)"
    load = os.getloadavg()
    np_times, torch_times = [], []
    for r in range(args.repeat):  # alternate, so both see the same load
        model = MLP([784, args.hidden, 10], seed=r)
        np_times.append(fit(model, x, y, epochs=1, batch_size=args.batch, seed=r).epoch_seconds[0])
        torch_times.append(torch_epoch(x, y, args.hidden, args.batch, seed=r))
    mnist_acc = accuracy(model, x_te, y_te) if args.mnist else None

    d_tr, dy_tr, d_te, dy_te = load_digits(test_fraction=0.2, seed=0)
    digits = MLP([64, 128, 10], seed=0)
    t0 = time.perf_counter()
    fit(digits, d_tr, dy_tr, epochs=30, batch_size=32, lr=3e-3, seed=0)
    digits_s = time.perf_counter() - t0
    digits_acc = accuracy(digits, d_te, dy_te)

    np_s, torch_s = min(np_times), min(torch_times)
    out = {
        "data": data, "mlp": f"784-{args.hidden}-10 relu", "batch": args.batch, "threads": args.threads,
        "numpy_epoch_s": round(np_s, 3), "torch_epoch_s": round(torch_s, 3),
        "numpy_over_torch": round(np_s / torch_s, 2),
        "target_numpy_epoch_s": 5.0, "met": np_s <= 5.0, "numpy_epoch_all_s": [round(t, 3) for t in np_times],
        "torch_epoch_all_s": [round(t, 3) for t in torch_times], "mnist_test_accuracy": mnist_acc,
        "digits": {"mlp": "64-128-10 relu", "epochs": 30, "test_accuracy": round(digits_acc, 4),
                   "train_s": round(digits_s, 2), "target": 0.97, "met": digits_acc >= 0.97},
        "loadavg": [round(v, 2) for v in load], "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }
    write_json(args.out, out)
    print(f"NumPy MLP epoch ({data}, batch {args.batch}): {np_s:.2f} s (target <= 5 s), PyTorch {torch_s:.2f} s, "
          f"ratio {np_s / torch_s:.2f}x ({args.threads} thread(s), load {load[0]:.1f})")
    print(f"digits: test accuracy {digits_acc:.2%} (target >= 97%) in {digits_s:.1f} s -> {args.out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
