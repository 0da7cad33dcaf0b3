"""tinystack.kernels.build, the one loader of the C++ extensions: a slow load (a compile) says so on stderr while it
runs, a fast one (a cached library) says nothing, a failed one warns once and gives None."""
from __future__ import annotations

import time

import pytest
from torch.utils import cpp_extension

from tinystack.kernels import build as kbuild


def test_a_slow_load_says_it_is_compiling_and_a_fast_one_is_silent(tmp_path, monkeypatch, capsys):
    src = tmp_path / "k.cpp"
    src.write_text("// a kernel\n")
    monkeypatch.setattr(kbuild, "NOTICE_AFTER_S", 0.05)
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: (time.sleep(0.5), "compiled")[1])
    assert kbuild.build("tinystack_test_kernels", [src]) == "compiled"
    assert "compiling the C++ extension tinystack_test_kernels" in capsys.readouterr().err
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: "cached")
    assert kbuild.build("tinystack_test_kernels", [src]) == "cached"
    time.sleep(0.2)  # past the notice's delay: it was cancelled, not just late
    assert capsys.readouterr().err == ""


def test_a_failed_build_warns_once_and_gives_none(tmp_path, monkeypatch):
    src = tmp_path / "k.cpp"
    src.write_text("// a kernel\n")

    def no_compiler(**kw):
        raise RuntimeError("Error building extension: c++: command not found\nmore")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    with pytest.warns(RuntimeWarning, match="tinystack_test_kernels unavailable .*command not found") as caught:
        assert kbuild.build("tinystack_test_kernels", [src]) is None
    assert len(caught) == 1 and "more" not in str(caught[0].message)


def test_the_name_carries_the_sources_hash(tmp_path, monkeypatch):
    src = tmp_path / "k.cpp"
    names = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: names.append(kw["name"]))
    for text in ("// one\n", "// one\n", "// two\n"):
        src.write_text(text)
        kbuild.build("tinystack_test_kernels", [src])
    assert names[0] == names[1] != names[2] and all(n.startswith("tinystack_test_kernels_") for n in names)


def test_every_cpp_source_ships_from_the_kernels_package():
    """The C++ sources live under tinystack/kernels/ only, and pyproject's package-data globs name every one of them
    (an installed, non-editable copy compiles from the files it shipped)."""
    import fnmatch
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[2]
    src = root / "src"
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    sources = [p for p in (src / "tinystack").rglob("*") if p.suffix in (".cpp", ".h")]
    assert sources
    for p in sources:
        rel = p.relative_to(src)
        assert rel.parts[:2] == ("tinystack", "kernels"), f"{rel}: C++ outside tinystack/kernels"
        package = ".".join(rel.parent.parts)
        assert any(fnmatch.fnmatch(p.name, g) for g in data.get(package, [])), f"{rel} not in package-data"


def test_a_lock_left_by_a_killed_build_is_removed_and_a_live_one_is_waited_for(tmp_path, monkeypatch):
    """torch's build lock has no owner: a build killed mid-compile left it and every later load hung. A lock
    older than STALE_LOCK_S goes (with a warning); a younger one is waited for until its builder removes it."""
    import os
    import threading

    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path))
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - kbuild.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="left .* by a build that did not finish"):
        kbuild.wait_for_build_lock("tinystack_test_kernels")
    assert not lock.exists()

    lock.touch()  # a live build: it finishes (removes its lock) a moment later
    threading.Timer(0.5, lock.unlink).start()
    t0 = time.perf_counter()
    kbuild.wait_for_build_lock("tinystack_test_kernels")
    assert time.perf_counter() - t0 >= 0.4 and not lock.exists()
