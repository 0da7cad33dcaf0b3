"""The NumPy backend is readable and runnable on its own: importing it must not pull in torch."""
import subprocess
import sys


def test_numpy_backend_imports_without_torch():
    code = ("import sys, tinystack.nn, tinystack.nn.gpt, tinystack.nn.mlp, tinystack.nn.optim, tinystack.nn.schedule; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
