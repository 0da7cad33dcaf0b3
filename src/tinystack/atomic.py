"""Crash-safe file writes, shared by every layer.

Everything the pipeline leaves on disk (JSONL splits, manifests, checkpoints,
eval.json) goes through here: the bytes are written to a temporary file in the
same directory, flushed and fsync'ed, then `os.replace`d over the target. A crash
mid-write therefore leaves the previous file intact, never a truncated one.
`atomic_dir` does the same for a whole directory (a model directory): it is built in a
temporary sibling, every file fsync'ed, then renamed into place.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on clean exit it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be readable like any file
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temp directory beside `path`; on clean exit it replaces `path`, on error it is removed.

    A reader sees the old directory or the whole new one, never a half-written one; a previous
    `path` is moved aside first and deleted after the new one is in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                os.chmod(f, 0o644)  # as atomic_open: readable like any file, whatever wrote it
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)  # the moment the new directory becomes visible
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    """Atomically write `obj` as indented, key-sorted JSON."""
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks (lineage hashes of every layer)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
