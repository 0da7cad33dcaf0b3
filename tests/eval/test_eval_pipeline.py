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
                           "--workdir", str(work), "--no-serve", "--set", "train.max_iters=40",
                           "--set", "eval.regression_cases=5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"report: {work / 'report.html'}" in proc.stdout
    cases = [json.loads(line) for line in (work / "regression.jsonl").read_text().splitlines()]
    assert len(cases) == 5 and all(c["expect"] == "max_loss" and c["prompt"] and c["target"] for c in cases)
    reg = json.loads((work / "regression.json").read_text())
    assert reg["summary"]["total"] == 5 and len(reg["new"]["cases"]) == 5
    ev = json.loads((work / "eval.json").read_text())
    assert ev["val"]["docs"]["total"]["docs"] > 0 and ev["findings"] and "greedy" in ev["generation"]
    page = (work / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "Regression set" in page
    # the model's lineage keeps the compact window metrics only (not the per-document slices)
    lineage = json.loads((work / "model" / "tinystack.json").read_text())
    assert lineage["metrics"]["val"]["loss"] == ev["val"]["loss"] and "docs" not in lineage["metrics"]["val"]
