"""The evaluation stages: offline metrics + generation checks, the regression set and gate, the report.

Called by `tinystack run` and by `tinystack eval`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tinystack.atomic import write_json
from tinystack.config import Config
from tinystack.progress import console


def stage_eval(cfg: Config, model_dir: Path, tok_dir: Path | None, out: Path,
               data_dir: Path | None = None) -> dict[str, Any]:
    """Offline metrics to `out` (eval.json); with `data_dir` also slices, bad cases, leakage and
    generation checks (tinystack.eval). Returns the per-split window metrics (for the lineage)."""
    from tinystack.eval.gate import load_model_dir
    from tinystack.eval.generation import generation_checks
    from tinystack.eval.offline import SPLITS, evaluate_model
    from tinystack.eval.show import print_eval
    from tinystack.eval.threads import torch_threads

    model, tokenizer = load_model_dir(model_dir, device=cfg.run.device)
    results: dict[str, Any] = {"model": str(model_dir)}
    with torch_threads(cfg.run.threads):
        results.update(evaluate_model(model, tokenizer, cfg.eval, data_dir=data_dir, tok_dir=tok_dir,
                                      device=cfg.run.device))
        results["generation"] = generation_checks(model, tokenizer, cfg.eval.gen_prompts or cfg.run.demo_prompts,
                                                  max_tokens=cfg.eval.gen_max_tokens, device=cfg.run.device)
    write_json(out, results)
    print_eval(console, results)
    return {s: {k: v for k, v in results[s].items() if k != "docs"} for s in SPLITS}


def stage_regression(cfg: Config, model_dir: Path, data_dir: Path, workdir: Path) -> dict[str, Any]:
    """The promotion gate's measurement: the name's regression set on the new model and, when the registry
    has a current model of that name, on it side by side (+ val/test bits per byte) -> regression.jsonl
    (the cases) and regression.json (results, summary and the gate's verdict)."""
    from tinystack.eval.gate import build_heldout_cases, run_regression
    from tinystack.eval.promotion import regression_set, verdict
    from tinystack.eval.registry import ModelRegistry
    from tinystack.eval.regression import write_cases
    from tinystack.eval.show import print_regression
    from tinystack.eval.threads import torch_threads

    registry = ModelRegistry(cfg.run.registry)
    heldout = build_heldout_cases(model_dir, data_dir, cfg.eval.regression_cases)
    cases, baseline, version = regression_set(registry, cfg.run.name, heldout,
                                              cfg.eval.gen_prompts or cfg.run.demo_prompts, cfg.eval.gen_max_tokens)
    write_cases(workdir / "regression.jsonl", cases)
    with torch_threads(cfg.run.threads):
        result = run_regression(model_dir, cases, baseline, tolerance=cfg.eval.regression_tolerance,
                                device=cfg.run.device, data_dir=data_dir if baseline else None, eval_cfg=cfg.eval)
    result["gate"] = {"name": cfg.run.name, "registry": str(registry.root), "baseline_version": version,
                      **verdict(result)}
    write_json(workdir / "regression.json", result)
    print_regression(console, result)
    return {**result["summary"], "gate": result["gate"]}


def stage_report(cfg: Config, workdir: Path) -> dict[str, Any]:
    """report.md + self-contained report.html from eval.json, regression.json and train_log.jsonl."""
    from tinystack.eval.report import write_report

    return write_report(workdir)
