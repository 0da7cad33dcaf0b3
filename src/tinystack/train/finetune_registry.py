"""A fine-tune into the model registry (`tinystack finetune --register NAME`), through the registry's gate.

    versus_current(name, base_dir, val_batches, tuned_loss, ...)  a LoRA fine-tune against the adapter current
        -> {"version", "loss", "delta"} | None                   under NAME for the same base (by weights hash):
                                                                 its loss on this fine-tune's held-out batches
                                                                 (the one scoring function), None when there is
                                                                 no such adapter
    register(name, out_dir, adapter_dir, report, base_dir, root)  a LoRA fine-tune adds its adapter (kind "lora",
                                                                 the base named by hash, the fine-tune's report
                                                                 as lineage), a full one its model directory; it
                                                                 becomes current only if finetune_refusal allows

So an adapter is promoted when its target cases beat the base and the adapter it would replace, and its general
prompts did not get worse; `tinystack serve --lora-modules NAME=registry:NAME` serves the current one and loads
each later promotion (serve/lora_registry.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tinystack.atomic import file_sha256
from tinystack.eval.registry import ModelRegistry, finetune_refusal
from tinystack.eval.scoring import score_batches
from tinystack.model.io import load_model
from tinystack.model.lora_adapter import LoRAAdapter
from tinystack.progress import console
from tinystack.train.precision import autocast


def base_sha256(base_dir: Path) -> str:
    return file_sha256(Path(base_dir) / "model.safetensors")


def versus_current(registry_root: str, name: str, base_dir: Path, val_batches: Any, tuned_loss: float, dtype: str,
                   device: str) -> dict[str, Any] | None:
    reg = ModelRegistry(registry_root)
    version = reg.current(name) if (Path(registry_root) / name / "index.json").is_file() else None
    if version is None:
        return None
    record = reg.record(name, version)
    if record.get("kind") != "lora" or record.get("base_model_sha256") != base_sha256(base_dir):
        return None
    model = LoRAAdapter.load(reg.model_dir(name, version)).merge_into(load_model(base_dir, device=device))
    with autocast(dtype, model.lm_head.weight.device.type):
        loss = score_batches(model, val_batches, device=device).loss
    return {"version": version, "loss": loss, "delta": tuned_loss - loss}


def register(name: str, out_dir: Path, adapter_dir: Path | None, report: dict[str, Any], base_dir: Path,
             registry_root: str) -> None:
    """Add the fine-tune as the next version of `name`; current only if the registry's fine-tune gate
    (eval.registry.finetune_refusal) allows it, as `tinystack models promote` would."""
    reg = ModelRegistry(registry_root)
    if adapter_dir is not None:
        version = reg.add(name, adapter_dir, {"gated_against": "base and the current adapter",
                                              "base_model": str(base_dir), "base_model_sha256": base_sha256(base_dir),
                                              "lineage": {"finetune": report}})
    else:
        version = reg.add(name, out_dir, {"gated_against": "base"})
    refusal = finetune_refusal(reg.record(name, version))
    what = "adapter" if adapter_dir is not None else "model"
    if refusal:
        console.print(f"registry: {name} {version} ({what}) added, not promoted: {refusal}")
    else:
        reg.promote(name, version)
        console.print(f"registry: {name} {version} ({what}) promoted (held-out loss below the base's"
                      f"{' and the current adapter' if report['heldout'].get('current') else ''}, general prompts "
                      "kept)")
