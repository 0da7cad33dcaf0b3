"""The promotion gate: a new model becomes a name's current model only when it is not worse.

    regression_set(registry, name, ...)   the cases to gate on: the current model's stored set, or, for a
                                          name's first model, cases built from the held-out splits (loss bar
                                          ln(vocab)) plus generation cases (repetition, no broken UTF-8)
    run_gate(...)                         the cases (and val/test bits per byte) on NEW and on the current
                                          model side by side -> regression.json with a "gate" verdict
    promote_if_better(...)                adds NEW to the registry and makes it current when the verdict
                                          allows; otherwise raises NotPromoted naming the failing cases

A promoted version stores its cases recalibrated to its own scores (`case_sets.calibrate`):
thresholds are "this model's score + tolerance", so the set is a meaningful gate on its own
and the next candidate of the name is measured on exactly the same cases.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tinystack.eval.case_sets import calibrate, generation_cases
from tinystack.eval.registry import ModelRegistry, lineage_record
from tinystack.eval.regression import Case, load_cases, write_cases


class NotPromoted(RuntimeError):
    """The candidate regressed against the current model (or failed its own cases); the message lists why."""


def regression_set(registry: ModelRegistry, name: str, heldout: list[Case], prompts: list[str],
                   gen_max_tokens: int) -> tuple[list[Case], Path | None, str | None]:
    """(cases, baseline model dir or None, baseline version or None) for gating a candidate of `name`."""
    current = registry.current(name)
    if current is None:
        return heldout + generation_cases(prompts, max_tokens=gen_max_tokens), None, None
    return load_cases(registry.cases_path(name)), registry.model_dir(name), current


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """{"promote": bool, "failing": [case ids]} from a run_regression result."""
    if "rows" in result:
        failing = [r["id"] for r in result["rows"] if r["verdict"] == "worse"]
        if result["summary"].get("mean_loss_regressed"):
            failing.append("mean loss")
    else:
        failing = [r["id"] for r in result["new"]["cases"] if not r["passed"]]
    return {"promote": not failing, "failing": failing}


def promote_if_better(registry: ModelRegistry, name: str, model_dir: Path, result: dict[str, Any],
                      cases: list[Case], tolerance: float, workdir: Path) -> str:
    """Register and promote `model_dir` if `result` (this gate's regression run) allows; return the version.

    A model whose weights are already the current version's is left as it is (re-running a pipeline
    promotes nothing twice)."""
    gate = verdict(result)
    if not gate["promote"]:
        raise NotPromoted(f"not promoted: {name} stays at {registry.current(name) or 'no model'}; "
                          f"regressed: {', '.join(gate['failing'])}")
    current = registry.current(name)
    if current and registry.record(name)["model_sha256"] == lineage_record(model_dir)["model_sha256"]:
        return current
    calibrated = workdir / "regression.calibrated.jsonl"
    write_cases(calibrated, calibrate(cases, result["new"], tolerance))
    record = {"metrics": lineage_record(model_dir)["metrics"], "regression": result["summary"],
              "gated_against": current}
    version = registry.add(name, model_dir, record, cases=calibrated)
    registry.promote(name, version)
    return version
