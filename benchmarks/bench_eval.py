"""Evaluation layer figures on the smoke pipeline's model and data.

    python benchmarks/bench_eval.py [--config configs/smoke.toml] [--set KEY=VALUE ...] [--workdir DIR]

Trains (or reuses) the smoke model with `tinystack run --no-serve`, then measures:
  * window evaluation throughput (tokens/s) vs per-document scoring throughput, and the
    per-document batches' padding efficiency (real targets / computed positions);
  * the full evaluation with torch's default thread count vs one thread; that two runs give
    identical eval.json content (determinism), and whether the thread counts agree too;
  * the leakage check (data layer's MinHash-LSH index over train, queried with val+test);
  * the regression gate's sensitivity: weights perturbed by Gaussian noise of growing
    scale -> mean target-loss delta and whether the gate fires (PNG);
  * report generation time.
Writes benchmarks/results/eval.json and benchmarks/results/eval_gate.png.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from tinystack.atomic import atomic_open, write_json
from tinystack.config import load_config
from tinystack.eval.gate import build_heldout_cases, load_model_dir, run_regression
from tinystack.eval.neardup import find_near_duplicates
from tinystack.eval.offline import evaluate_model, read_records
from tinystack.eval.report import write_report
from tinystack.eval.scoring import _windows, context_len, document_ids, score_documents, score_tokens
from tinystack.eval.threads import torch_threads
from tinystack.model.io import load_model, save_model
from tinystack.pipeline import run_pipeline
from tinystack.tokenizer.shards import load_tokens, token_byte_lengths

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import timed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def throughput(model, tok, cfg, tok_dir: Path, data_dir: Path) -> dict:
    """Window evaluation vs per-document scoring of the val split, and the latter's padding efficiency."""
    val = load_tokens(tok_dir / "val.bin")
    B = cfg.eval.windows_per_batch
    s, _, m = timed(lambda: score_tokens(model, val, token_byte_lengths(tok), batch_size=B).to_dict())
    out = {"windows": {"tokens": m["tokens"], "seconds": round(s, 3), "tokens_per_s": round(m["tokens"] / s)}}
    recs = read_records(data_dir / "val.jsonl")
    ids = [document_ids(tok, r["text"]) for r in recs]
    s, _, sc = timed(lambda: score_documents(model, ids, [len(r["text"].encode()) + 1 for r in recs],
                                          batch_size=cfg.eval.windows_per_batch))
    wins = sorted(_windows(ids, context_len(model)), key=lambda w: -len(w[1]))
    B = cfg.eval.windows_per_batch
    # positions the model computes: each batch is as wide as its first (longest) window
    computed = sum(len(wins[b:b + B]) * (len(wins[b][1]) - 1) for b in range(0, len(wins), B))
    scored = int(sc.tokens.sum())
    out["per_document"] = {"docs": len(recs), "tokens": scored, "seconds": round(s, 3),
                           "tokens_per_s": round(scored / s), "padding_efficiency": round(scored / computed, 3)}
    speed_ratio = out["per_document"]["tokens_per_s"] / out["windows"]["tokens_per_s"]
    out["per_document_vs_windows_speed"] = round(speed_ratio, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "smoke.toml"))
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "tinystack_bench_eval"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    args = ap.parse_args()
    cfg = load_config(args.config, args.set)
    work = Path(args.workdir)
    run_pipeline(cfg, work, serve_demo=False, promote=False)  # measures; registers nothing in the registry
    model_dir, data_dir, tok_dir = work / "model", work / "data", work / "tokenizer"
    model, tok = load_model_dir(model_dir)
    res: dict = {"config": args.config, "overrides": args.set, "load_avg_start": os.getloadavg()[0],
                 "torch_threads": torch.get_num_threads()}

    with torch_threads(cfg.run.threads):  # windows vs per-document, with the threads the eval stage uses
        res["throughput_threads"] = torch.get_num_threads()
        res.update(throughput(model, tok, cfg, tok_dir, data_dir))

    def full_eval():
        return evaluate_model(model, tok, cfg.eval, data_dir=data_dir, tok_dir=tok_dir, progress=False)

    s_default, _, a = timed(full_eval)  # torch's default thread count (one per core)
    with torch_threads(1):
        s_one, _, b = timed(full_eval)
        c = full_eval()
    same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731
    res["evaluate_model"] = {"seconds_default_threads": round(s_default, 3), "seconds_1_thread": round(s_one, 3),
                             "speedup_1_thread": round(s_default / s_one, 2), "deterministic": same(b, c),
                             "identical_across_thread_counts": same(a, b)}

    train = [r["text"] for r in read_records(data_dir / "train.jsonl")]
    held = [r["text"] for sp in ("val", "test") for r in read_records(data_dir / f"{sp}.jsonl")]
    s, _, dups = timed(lambda: find_near_duplicates(train, held, cfg.eval.near_dup_threshold))
    res["leakage_check"] = {"train_docs": len(train), "heldout_docs": len(held), "seconds": round(s, 3),
                            "leaked": sum(d is not None for d in dups)}

    cases = build_heldout_cases(model_dir, data_dir, 32)
    sigmas = [0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]
    gate = []
    with tempfile.TemporaryDirectory() as tmp:
        for sigma in sigmas:
            pert = load_model(model_dir)
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in pert.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * sigma)
            out = Path(tmp) / f"s{sigma}"
            save_model(pert, out, eos_token_id=tok.eos_token_id)
            shutil.copy(model_dir / "tokenizer.json", out / "tokenizer.json")
            with torch_threads(cfg.run.threads):
                # out=out binds this iteration's directory (timed calls the lambda at once; explicit all the same)
                s, _, r = timed(lambda out=out: run_regression(out, cases, model_dir,
                                                               tolerance=cfg.eval.regression_tolerance))
            sm = r["summary"]
            gate.append({"sigma": sigma, "mean_loss_delta": round(sm["mean_loss_delta"], 4), "worse": sm["worse"],
                         "regressed": sm["regressed"], "seconds": round(s, 2)})
    res["gate"] = {"cases": len(cases), "tolerance": cfg.eval.regression_tolerance, "runs": gate}

    s, _, _ = timed(lambda: write_report(work))
    res["report_seconds"] = round(s, 3)
    res["load_avg_end"] = os.getloadavg()[0]
    write_json(ROOT / "benchmarks" / "results" / "eval.json", res)
    _plot(gate, cfg.eval.regression_tolerance, ROOT / "benchmarks" / "results" / "eval_gate.png")
    print(json.dumps(res, indent=2))


def _plot(gate: list[dict], tol: float, path: Path) -> None:
    from tinystack.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [g["sigma"] for g in gate]
    ys = [g["mean_loss_delta"] for g in gate]
    ax.plot(xs, ys, "o-", label="mean target-loss delta (NEW - BASELINE)")
    ax.scatter([x for x, g in zip(xs, gate) if g["regressed"]], [y for y, g in zip(ys, gate) if g["regressed"]],
               color="tab:red", zorder=3, label="gate fires (exit 1)")
    ax.axhline(tol, color="gray", ls="--", label=f"tolerance {tol}")
    ax.set_xscale("symlog", linthresh=0.002)
    ax.set_xlim(0, max(xs) * 1.2)
    ax.set_xlabel("weight noise sigma")
    ax.set_ylabel("nats per target byte")
    ax.set_title("regression gate vs deliberate weight perturbation")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


if __name__ == "__main__":
    main()
