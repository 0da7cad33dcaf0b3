"""[serve] lora_modules: the LoRA adapters a server loads at its start, by path or from the model registry.

    NAME=PATH                        a PEFT adapter directory (vLLM's --lora-modules)
    NAME=registry:REG[@vN]           the registry's adapter REG (eval/registry.py, where `tinystack finetune
                                     --register REG` puts a LoRA fine-tune that passed its gate): pinned at vN,
                                     or its current version, followed: each later promotion is loaded while the
                                     server runs, no restart
    parse(cfg) -> [(name, spec)]                         a bad entry: ValueError naming it
    resolve(spec, registry_root) -> (path, followed, version)   followed: REG when unpinned, else None
    load_list(cfg, registry_root) -> [(name, spec, path, followed, version)]   both, for the app's start
    follow(adapter, watched, registry_root)              coroutine, run by the app's lifespan: every
                                                         FOLLOW_INTERVAL_S it reads each followed name's current
                                                         version; a new one replaces the loaded adapter under the
                                                         same served name (requests running finish with the old,
                                                         LLMEngine.add_lora(replace=True)); one that does not
                                                         load is logged once and the old one kept
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from tinystack.config import ServeConfig
from tinystack.eval.registry import PREFIX, ModelRegistry, is_adapter, resolve_model

logger = logging.getLogger("tinystack.serve")
FOLLOW_INTERVAL_S = 2.0  # a promotion reaches the server within this long (reading one small JSON file)


def parse(cfg: ServeConfig) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for entry in cfg.lora_modules:
        name, sep, spec = entry.partition("=")
        if not sep or not name or not spec:
            raise ValueError(f"serve.lora_modules: {entry!r} is not NAME=PATH or NAME=registry:NAME[@VERSION]")
        if not spec.startswith(PREFIX) and not Path(spec).is_dir():
            raise ValueError(f"serve.lora_modules: {spec} (for {name!r}) is not a directory")
        if name in {n for n, _ in out} or name == cfg.model_name:
            raise ValueError(f"serve.lora_modules: the name {name!r} is given twice")
        out.append((name, spec))
    return out


def resolve(spec: str, registry_root: str | Path) -> tuple[Path, str | None, str | None]:
    """The adapter directory `spec` names; for a registry spec also the name to follow (None when pinned) and
    the version resolved. RegistryError / ValueError (one line) when there is none or it is not an adapter."""
    path = resolve_model(spec, registry_root)
    if not spec.startswith(PREFIX):
        return path, None, None
    name, _, pinned = spec[len(PREFIX):].partition("@")
    version = path.parent.name
    if not is_adapter(path):
        raise ValueError(f"{spec}: {name} {version} in {registry_root} is a model, not a LoRA adapter")
    return path, (None if pinned else name), version


def load_list(cfg: ServeConfig, registry_root: str | Path) -> list[tuple[str, str, Path, str | None, str | None]]:
    out = []
    for name, spec in parse(cfg):
        try:
            out.append((name, spec, *resolve(spec, registry_root)))
        except ValueError as e:  # RegistryError too
            raise ValueError(f"serve.lora_modules {name}={spec}: {e}") from None
    return out


async def follow(adapter: Any, watched: dict[str, list[str]], registry_root: str | Path) -> None:
    """watched: served name -> [registry name, version loaded]; runs until cancelled."""
    reg, failed = ModelRegistry(registry_root), set()
    while True:
        await asyncio.sleep(FOLLOW_INTERVAL_S)
        for served, (name, loaded) in watched.items():
            current = reg.current(name)
            if current is None or current == loaded or (served, current) in failed:
                continue
            try:
                await adapter.add_lora(served, str(reg.model_dir(name, current)), replace=True)
            except (ValueError, OSError, NotImplementedError) as e:
                failed.add((served, current))
                logger.warning("lora %s: registry:%s %s did not load (%s); %s stays", served, name, current, e, loaded)
                continue
            watched[served][1] = current
            logger.info("lora %s: registry:%s %s -> %s", served, name, loaded, current)
