"""The model registry: promoted models per name, with their lineage, and which one is current.

    <root>/<name>/index.json              {"current": "v3", "promotions": ["v1", "v2", "v3"], "next": 4}
    <root>/<name>/v3/model/               the model directory, or a LoRA adapter's (PEFT's layout; its record
                                          names the base by hash), as hard links to the source files where the
                                          filesystem allows, else a copy: the registry owns what it serves
    <root>/<name>/v3/record.json          lineage: model / data manifest / tokenizer hashes, training config,
                                          metrics, regression results, source path, time
    <root>/<name>/v3/cases.jsonl          the regression set the version was gated with (the next
                                          candidate of this name is gated on the same cases)

`add` stores a candidate version (not current); `promote` makes a version current and
appends it to the promotion history; `rollback` makes the previously promoted version
current again. Every index write is atomic (tinystack.atomic) and every change holds an
exclusive lock on `<root>/<name>/.lock`, so two runs promoting at once neither lose a
version nor hand out the same version id twice. `resolve_model("registry:NAME[@vN]")` is
how other commands (serve, eval) name a registered model.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from tinystack.atomic import file_sha256, read_json, write_json

PREFIX = "registry:"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class RegistryError(ValueError):
    """A registry name, version or state the caller asked for does not exist or is not allowed."""


def lineage_record(model_dir: Path) -> dict[str, Any]:
    """What the registry records of a model directory: its weights hash and the lineage it carries (for a LoRA
    adapter's directory: kind "lora" and its weights hash; the caller adds the base and the lineage)."""
    if is_adapter(model_dir):
        return {"kind": "lora", "model_sha256": file_sha256(model_dir / "adapter_model.safetensors")}
    lineage = read_json(model_dir / "tinystack.json") if (model_dir / "tinystack.json").is_file() else {}
    weights = model_dir / "model.safetensors"
    return {"model_sha256": file_sha256(weights) if weights.is_file() else None,
            "data_manifest_hash": lineage.get("data_manifest_hash"),
            "tokenizer_hash": lineage.get("tokenizer_hash"),
            "config": lineage.get("training") or lineage.get("source"),
            "metrics": lineage.get("metrics"), "lineage": lineage}


def is_adapter(path: Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def finetune_refusal(record: dict[str, Any]) -> str | None:
    """Why a fine-tuned model may never be promoted, or None: the fine-tune's own gate (train/finetune.py)
    is target cases better (held-out loss below the base's, and for an adapter below the adapter current under
    its name when it was registered) and general prompts not worse (the forgetting guard passed, or was
    overridden with finetune.allow_forgetting)."""
    ft = (record.get("lineage") or {}).get("finetune")
    if not ft:
        return None
    if ft.get("rejected"):
        return f"the fine-tune forgot what its base knew ({ft['rejected']})"
    delta = (ft.get("heldout") or {}).get("delta")
    if delta is not None and delta >= 0:
        return f"the fine-tune's held-out loss is not below its base's ({delta:+.3f} nats/token)"
    current = (ft.get("heldout") or {}).get("current")
    if current and current["delta"] >= 0:
        return (f"its held-out loss is not below that of {current['version']}, the adapter current when it was "
                f"registered ({current['delta']:+.3f} nats/token)")
    return None


class ModelRegistry:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    # --- reading -------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "index.json").is_file())

    def index(self, name: str) -> dict[str, Any]:
        path = self._dir(name) / "index.json"
        return read_json(path) if path.is_file() else {"current": None, "promotions": [], "next": 1}

    def versions(self, name: str) -> list[str]:
        d = self._dir(name)
        found = [p.name for p in d.iterdir() if (p / "record.json").is_file()] if d.is_dir() else []
        return sorted(found, key=lambda v: int(v[1:]))

    def current(self, name: str) -> str | None:
        return self.index(name)["current"]

    def record(self, name: str, version: str | None = None) -> dict[str, Any]:
        return read_json(self._version_dir(name, version) / "record.json")

    def model_dir(self, name: str, version: str | None = None) -> Path:
        return self._version_dir(name, version) / "model"

    def cases_path(self, name: str, version: str | None = None) -> Path:
        return self._version_dir(name, version) / "cases.jsonl"

    # --- changing ------------------------------------------------------------------------------------
    def add(self, name: str, model_dir: Path, record: dict[str, Any], cases: Path | None = None) -> str:
        """Store `model_dir` as the next version of `name` (not current yet); return its id ("v4")."""
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file() and not is_adapter(model_dir):
            raise RegistryError(f"{model_dir} is not a model directory (no config.json) nor a LoRA adapter's")
        with self._locked(name):
            idx = self.index(name)
            version = f"v{idx['next']}"
            final = self._dir(name) / version
            tmp = self._dir(name) / f".{version}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            _link_tree(model_dir, tmp / "model")
            if cases is not None:
                shutil.copyfile(cases, tmp / "cases.jsonl")
            write_json(tmp / "record.json", {**lineage_record(model_dir), **record, "name": name,
                                             "version": version, "source": str(model_dir),
                                             "added_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            os.replace(tmp, final)  # the version appears whole or not at all
            write_json(self._dir(name) / "index.json", {**idx, "next": idx["next"] + 1})
        return version

    def promote(self, name: str, version: str) -> None:
        with self._locked(name):
            if not (self._dir(name) / version / "record.json").is_file():
                raise RegistryError(f"{name} has no version {version!r} (versions: {', '.join(self.versions(name))})")
            refused = finetune_refusal(self.record(name, version))
            if refused:
                raise RegistryError(f"{name} {version} is not promotable: {refused}")
            idx = self.index(name)
            write_json(self._dir(name) / "index.json",
                       {**idx, "current": version, "promotions": [*idx["promotions"], version]})

    def rollback(self, name: str) -> str:
        """Make the version promoted before the current one current again; return it."""
        with self._locked(name):
            idx = self.index(name)
            history = idx["promotions"]
            if len(history) < 2:
                raise RegistryError(f"{name}: nothing to roll back to (promotions: {history or 'none'})")
            previous = history[-2]
            write_json(self._dir(name) / "index.json", {**idx, "current": previous, "promotions": history[:-1]})
        return previous

    # --- helpers -------------------------------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        if not _NAME.match(name):
            raise RegistryError(f"bad model name {name!r}: letters, digits, '.', '_', '-' (at most 100)")
        return self.root / name

    def _version_dir(self, name: str, version: str | None) -> Path:
        version = version or self.current(name)
        if version is None:
            known = ", ".join(self.names()) or "none"
            raise RegistryError(f"no promoted model named {name!r} in {self.root} (names: {known})")
        d = self._dir(name) / version
        if not (d / "record.json").is_file():
            raise RegistryError(f"{name} has no version {version!r} (versions: {', '.join(self.versions(name))})")
        return d

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        d = self._dir(name)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link every file of `src` into `dst` (copy where links cannot cross filesystems)."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def resolve_model(spec: str | Path, registry_root: str | Path) -> Path:
    """`registry:NAME` (current) or `registry:NAME@v2` -> that version's model directory; a path stays a path."""
    text = str(spec)
    if not text.startswith(PREFIX):
        return Path(spec)
    name, _, version = text[len(PREFIX):].partition("@")
    return ModelRegistry(registry_root).model_dir(name, version or None)
