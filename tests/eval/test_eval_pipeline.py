"""`tinystack run` builds and runs the regression set and writes the report, printing its path."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_run_writes_regression_set_and_report(tmp_path):
    work = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tinystack", "run", "--config", str(ROOT / "configs" / "smoke.toml"),
                           "--workdir", str(work), "--no-serve", "--registry", str(tmp_path / "registry"),
                           "--set", "train.max_iters=40",
                           "--set", "eval.regression_cases=5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"report: {work / 'report.html'}" in proc.stdout
    cases = [json.loads(line) for line in (work / "regression.jsonl").read_text().splitlines()]
    loss = [c for c in cases if c["expect"] == "max_loss"]
    assert len(loss) == 5 and all(c["prompt"] and c["target"] for c in loss)
    # and per demo prompt two generation cases: repetition and no broken UTF-8
    assert sorted(c["expect"] for c in cases if c not in loss) == ["max_repetition"] * 4 + ["not_contains"] * 4
    reg = json.loads((work / "regression.json").read_text())
    assert reg["summary"]["total"] == len(cases) and len(reg["new"]["cases"]) == len(cases)
    assert reg["gate"]["promote"] and reg["gate"]["baseline_version"] is None
    ev = json.loads((work / "eval.json").read_text())
    assert ev["val"]["docs"]["total"]["docs"] > 0 and ev["findings"] and "greedy" in ev["generation"]
    page = (work / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "Regression set" in page
    # the model's lineage keeps the compact window metrics only (not the per-document slices)
    lineage = json.loads((work / "model" / "tinystack.json").read_text())
    assert lineage["metrics"]["val"]["loss"] == ev["val"]["loss"] and "docs" not in lineage["metrics"]["val"]
