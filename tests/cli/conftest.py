"""`run_cli`: `tinystack ARGS` through the console entry point's main(), in this process (argv in, SystemExit and
the captured streams out), so a test pays no fresh interpreter's torch import per command. Tests whose subject is
the process itself (the smoke run under core-only imports, a signal, a pseudo-terminal) start real ones."""
import io
import subprocess
import sys
from pathlib import Path

import pytest

from tinystack.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """run(*args, stdin="") -> CompletedProcess(args, returncode, stdout, stderr), run from the repository root."""
    monkeypatch.delenv("TINYSTACK_DEBUG", raising=False)
    monkeypatch.chdir(ROOT)

    def run(*args, stdin: str = "") -> subprocess.CompletedProcess:
        argv = ["tinystack", *map(str, args)]
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()  # what ran before is not this command's output
        with pytest.raises(SystemExit) as e:
            main()
        code = e.value.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code if isinstance(code, int) else 0 if code is None else 1,
                                           out.out, out.err)

    return run
