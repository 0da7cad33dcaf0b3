"""tinystack.native.build, the one loader of the C++ extensions: a slow load (a compile) says so on stderr while it
runs, a fast one (a cached library) says nothing, a failed one warns once and gives None."""
from __future__ import annotations

import time

import pytest
from torch.utils import cpp_extension

from tinystack import native


def test_a_slow_load_says_it_is_compiling_and_a_fast_one_is_silent(tmp_path, monkeypatch, capsys):
    src = tmp_path / "k.cpp"
    src.write_text("// a kernel\n")
    monkeypatch.setattr(native, "NOTICE_AFTER_S", 0.05)
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: (time.sleep(0.5), "compiled")[1])
    assert native.build("tinystack_test_kernels", [src]) == "compiled"
    assert "compiling the C++ extension tinystack_test_kernels" in capsys.readouterr().err
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: "cached")
    assert native.build("tinystack_test_kernels", [src]) == "cached"
    time.sleep(0.2)  # past the notice's delay: it was cancelled, not just late
    assert capsys.readouterr().err == ""


def test_a_failed_build_warns_once_and_gives_none(tmp_path, monkeypatch):
    src = tmp_path / "k.cpp"
    src.write_text("// a kernel\n")

    def no_compiler(**kw):
        raise RuntimeError("Error building extension: c++: command not found\nmore")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    with pytest.warns(RuntimeWarning, match="tinystack_test_kernels unavailable .*command not found") as caught:
        assert native.build("tinystack_test_kernels", [src]) is None
    assert len(caught) == 1 and "more" not in str(caught[0].message)


def test_the_name_carries_the_sources_hash(tmp_path, monkeypatch):
    src = tmp_path / "k.cpp"
    names = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: names.append(kw["name"]))
    for text in ("// one\n", "// one\n", "// two\n"):
        src.write_text(text)
        native.build("tinystack_test_kernels", [src])
    assert names[0] == names[1] != names[2] and all(n.startswith("tinystack_test_kernels_") for n in names)
