"""Lazy package exports: `from tinystack.infer import LLM` works, but importing the package
(e.g. to reach `tinystack.infer.commands` while the CLI starts) does not import torch.

A layer's `__init__` lists {name: module} and calls `lazy_exports`; the module is
imported on first attribute access (PEP 562 module `__getattr__`).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return (`__getattr__`, `__dir__`) for `package` that import `exports[name]` on demand."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
