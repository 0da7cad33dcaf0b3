"""The import graph: no circle between modules, and no layer imports one above it.

Every `import` / `from ... import` of a tinystack module counts, at module level or inside a function: a
function-level import hides a circle from Python, not from a reader. The layers, bottom to top, are the
pipeline's order as the code uses it (docs/pipeline.md): a module may import its own layer and those below.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tinystack"

# bottom to top; the package's root modules (config, errors, atomic, progress, ...) are the base
LAYERS = ["base", "kernels", "data", "tokenizer", "model", "nn", "infer", "eval", "train", "observe", "serve",
          "pipeline", "cli", "__main__"]
ROOT_ABOVE_BASE = {"pipeline", "cli", "__main__"}  # root modules that are layers of their own


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """{module: the tinystack modules it imports}, names resolved to the module that defines them."""
    found: dict[str, set[str]] = defaultdict(set)
    modules = {_module(p) for p in SRC.rglob("*.py")}

    def resolve(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    for path in SRC.rglob("*.py"):
        mod = _module(path)
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                # a package's own __init__ (lazy re-exports) is not an edge to its modules
                if target.startswith("tinystack") and target != mod and not mod.startswith(target + "."):
                    found[mod].add(target)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    if len(parts) == 2 and not (SRC / parts[1]).is_dir():  # a root module
        return parts[1] if parts[1] in ROOT_ABOVE_BASE else "base"
    return parts[1]


def test_every_package_has_a_layer():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages <= set(LAYERS), packages - set(LAYERS)


def test_no_layer_imports_one_above_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(f"{src} -> {dst}" for src, dsts in _imports().items() for dst in dsts
                    if rank[_layer(dst)] > rank[_layer(src)])
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    graph = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_checks_see_a_planted_circle_and_an_upward_import(tmp_path, monkeypatch):
    """The graph is read from the source: a circle and an upward import written into a copy are both found."""
    import shutil

    copy = tmp_path / "tinystack"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (copy / "data" / "planted.py").write_text("from tinystack.serve import app\nfrom tinystack.data import planted2\n")
    (copy / "data" / "planted2.py").write_text("def f():\n    from tinystack.data import planted\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", copy)
    graph = _imports()
    assert any(d.startswith("tinystack.serve") for d in graph["tinystack.data.planted"])
    assert "tinystack.data.planted" in graph["tinystack.data.planted2"]
    _fails(test_no_layer_imports_one_above_it, "tinystack.data.planted -> tinystack.serve")
    _fails(test_no_import_circle, "tinystack.data.planted2")


def _fails(check, naming: str) -> None:
    try:
        check()
    except AssertionError as e:
        assert naming in str(e)
    else:
        raise AssertionError(f"{check.__name__} passed: it did not see {naming}")


# A command's module defers its imports so `tinystack --help` and a command's flag errors never load torch (the
# rule is stated in cli.py's docstring); these packages need an extra and are entered only through
# errors.require (their imports of Ray / OpenTelemetry are the optional dependency itself).
ENTRY_MODULES = {"commands.py", "cli.py", "stage.py", "pipeline.py"}
OPTIONAL_PATHS = ("serve/replicas/", "data/dedup/ray_engine.py", "observe/tracing.py")


def test_a_function_level_import_defers_something_and_says_what():
    """Inside a function an import hides the module graph; it stays only where it defers a heavy or optional
    dependency, with a `# deferred: ...` comment on its line or the line above."""
    unexplained = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if path.name in ENTRY_MODULES or rel.startswith(OPTIONAL_PATHS):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    here = lines[node.lineno - 1] + lines[node.lineno - 2]
                    if "# deferred" not in here and not _in_try(fn, node):
                        unexplained.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, "\n".join(unexplained)


def _in_try(fn: ast.AST, node: ast.AST) -> bool:
    """An import in a `try` whose ImportError is handled: a probe for an optional dependency, which is its reason."""
    return any(isinstance(t, ast.Try) and any(node in ast.walk(b) for b in t.body) for t in ast.walk(fn))
