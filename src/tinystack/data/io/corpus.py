"""The built-in corpus: docstrings of the local Python standard library, no network.

Every machine that runs tinystack has CPython's standard library sources, which hold
tens of thousands of well-written English docstrings. `build_corpus` turns them into
records:

* Walk ``sysconfig.get_paths()["stdlib"]`` in sorted order (directories and files), so
  the output is deterministic for a given Python build. Only directories whose names
  are Python identifiers are entered, which excludes ``site-packages``,
  ``lib-dynload`` and ``config-3.x-*`` (third-party code and build artefacts). Also
  skipped: test packages (``test``, ``tests``, ``idle_test``: fixtures and
  deliberately odd code), ``idlelib`` and ``turtledemo`` (applications, not library
  API), ``__phello__`` (a frozen-module test fixture) and ``_sysconfigdata_*.py``
  (generated, machine specific).
* Each ``.py`` file is parsed with `ast` (never imported: importing runs code and
  can have side effects). A file that fails to parse is skipped and counted.
* One record per non-empty docstring (`ast.get_docstring`, which dedents/cleans):
  ``source`` = dotted module name (``json/decoder.py`` -> ``json.decoder``,
  ``json/__init__.py`` -> ``json``), ``label`` = "module" | "class" | "function"
  (methods included), ``id`` = ``"{module}:{qualname}"`` (``"{module}:<module>"`` for the
  module docstring; a repeated qualname, e.g. a function defined in both branches of
  an ``if``, gets ``#2``, ``#3``... so ids are unique). Definitions nested in
  ``if``/``try`` blocks and in classes are included; functions local to a function
  body are not (implementation details).
* Then every entry of ``pydoc_data.topics.topics`` (the language reference text that
  ``help("with")`` shows): ``source`` = "pydoc_data.topics", ``label`` = "topic",
  ``id`` = ``"pydoc_data.topics:{topic}"``.

The corpus contains real exact duplicates (e.g. identical docstrings shared by the
pure-Python and re-exported implementations of a class); the pipeline's dedup step is
expected to find them, and `build_corpus` reports how many there are.
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import os
import sys
import sysconfig
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from tinystack.data.dedup.exact import exact_key
from tinystack.data.io.records import Record, write_jsonl

SKIP_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "turtledemo", "__phello__", "__pycache__"})
SKIP_FILE_PREFIXES = ("_sysconfigdata",)
_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> Iterator[tuple[Path, str]]:
    """(file, dotted module name) for every library .py file, in sorted order."""
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place (os.walk honours it) and sort, so the walk order is deterministic.
        dirnames[:] = sorted(d for d in dirnames if d.isidentifier() and d not in SKIP_DIRS)
        rel = Path(dirpath).relative_to(root).parts
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith(SKIP_FILE_PREFIXES):
                continue
            stem = name[:-3]
            if not stem.isidentifier():
                continue
            parts = list(rel) if stem == "__init__" else [*rel, stem]
            if parts:
                yield Path(dirpath) / name, ".".join(parts)


def _walk_defs(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, str, str]]:
    """(kind, qualname, docstring) for classes/functions in `body`, recursing into
    classes and into if/try blocks but not into function bodies."""
    for node in body:
        if isinstance(node, _DEFS):
            qual = f"{prefix}.{node.name}" if prefix else node.name
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                yield ("class" if isinstance(node, ast.ClassDef) else "function"), qual, doc
            if isinstance(node, ast.ClassDef):
                yield from _walk_defs(node.body, qual)
        elif isinstance(node, ast.If):
            yield from _walk_defs(node.body, prefix)
            yield from _walk_defs(node.orelse, prefix)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _walk_defs(block, prefix)


def module_records(tree: ast.Module, module: str) -> Iterator[Record]:
    """Records for one parsed module: its docstring, then its classes/functions."""
    doc = ast.get_docstring(tree, clean=True)
    if doc and doc.strip():
        yield Record(text=doc, source=module, label="module", id=f"{module}:<module>")
    seen: Counter[str] = Counter()
    for kind, qual, doc in _walk_defs(tree.body, ""):
        seen[qual] += 1
        rid = f"{module}:{qual}" if seen[qual] == 1 else f"{module}:{qual}#{seen[qual]}"
        yield Record(text=doc, source=module, label=kind, id=rid)


def topic_records(root: Path) -> Iterator[Record]:
    """One record per pydoc topic (none if this Python build lacks pydoc_data).

    The ``topics = {...}`` dict literal is read with `ast.literal_eval`, not imported,
    for the same reason as every other module (and so `root` is honoured).
    """
    path = root / "pydoc_data" / "topics.py"
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return
    topics: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
    for name in sorted(topics):
        if topics[name].strip():
            yield Record(text=topics[name], source="pydoc_data.topics", label="topic", id=f"pydoc_data.topics:{name}")


def iter_corpus(root: Path | None = None, stats: dict[str, Any] | None = None) -> Iterator[Record]:
    """Stream corpus records; if `stats` is given, file counters are updated in place."""
    stats = {} if stats is None else stats
    stats.update(files_scanned=0, files_parsed=0, parse_failures=0, failed_files=[])
    root = stdlib_root() if root is None else Path(root)
    for path, module in stdlib_files(root):
        stats["files_scanned"] += 1
        try:
            with warnings.catch_warnings():  # e.g. SyntaxWarning for odd escapes in old code
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes(), filename=str(path))  # bytes: honours coding cookies
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError, OSError):
            stats["parse_failures"] += 1
            stats["failed_files"].append(path.relative_to(root).as_posix())
            continue
        stats["files_parsed"] += 1
        yield from module_records(tree, module)
    yield from topic_records(root)


def build_corpus(out_path: str | Path, max_docs: int = 0, *, root: str | Path | None = None) -> dict[str, Any]:
    """Write the built-in corpus as JSONL (atomically) and return its statistics.

    `max_docs` > 0 keeps only the first `max_docs` records of the deterministic order
    (a prefix: fast, but covers fewer sources). `root` overrides the stdlib folder
    (for tests). Prints nothing. Stats keys: path, records, sources, bytes, sha256,
    by_label, exact_duplicates, exact_duplicate_rate, files_scanned, files_parsed,
    parse_failures, failed_files, truncated, python, stdlib.
    """
    out_path = Path(out_path)
    if max_docs < 0:
        raise ValueError(f"max_docs must be >= 0, got {max_docs}")
    root = stdlib_root() if root is None else Path(root)
    stats: dict[str, Any] = {}
    sources: Counter[str] = Counter()
    labels: Counter[str] = Counter()
    seen: set[bytes] = set()
    dups = 0

    def counted(records: Iterator[Record]) -> Iterator[Record]:
        nonlocal dups
        for r in records:
            sources[r.source] += 1
            labels[str(r.label)] += 1
            key = exact_key(r.text)
            dups += key in seen
            seen.add(key)
            yield r

    stream = iter_corpus(root, stats)
    if max_docs:
        stream = itertools.islice(stream, max_docs)
    n = write_jsonl(out_path, counted(stream))
    data = out_path.read_bytes()
    stats.update(
        path=str(out_path),
        records=n,
        sources=len(sources),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        by_label=dict(sorted(labels.items())),
        exact_duplicates=dups,
        exact_duplicate_rate=round(dups / n, 6) if n else 0.0,
        truncated=bool(max_docs) and n == max_docs,
        python=sys.version.split()[0],
        stdlib=str(root),
    )
    return stats
