"""A LoRA adapter as a file: PEFT's layout, what `tinystack finetune --lora R` writes and the server loads.

    adapter_config.json          {"peft_type": "LORA", "r", "lora_alpha", "target_modules", "use_rslora", ...}
    adapter_model.safetensors    base_model.model.<module path>.lora_A.weight [r, in], ...lora_B.weight [out, r]

so an adapter trained with PEFT for the same base loads here, and one written here loads in PEFT. The module paths
are the base model's own (Hugging Face's names: model.layers.0.self_attn.q_proj); the update to W is
scale B A with scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


@dataclass
class LoRAAdapter:
    """One adapter: module path (the base model's, e.g. model.layers.0.self_attn.q_proj) -> (A [r, in], B [out, r]),
    and its scale."""

    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    rank: int
    scale: float
    path: str = ""

    @classmethod
    def load(cls, path: str | Path) -> LoRAAdapter:
        path = Path(path)
        if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
            raise ValueError(f"{path}: not a LoRA adapter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
        try:
            cfg = json.loads((path / CONFIG_FILE).read_text())
            rank, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
            if rank < 1:
                raise ValueError(f"r = {rank}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path / CONFIG_FILE}: not a LoRA adapter config ({e!r})") from None
        if cfg.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"{path}: peft_type {cfg['peft_type']!r}; only LORA adapters are served")
        scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
        try:
            tensors = load_file(str(path / WEIGHTS_FILE))
        except Exception as e:  # safetensors' own error type: a truncated or foreign file
            raise ValueError(f"{path / WEIGHTS_FILE}: not a readable safetensors file ({e})") from None
        weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                continue
            module = key.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
            b = tensors.get(key.replace(".lora_A.", ".lora_B."))
            if b is None:
                raise ValueError(f"{path}: {key} has no lora_B beside it")
            weights[module] = (a, b)
        if not weights:
            raise ValueError(f"{path}: no lora_A / lora_B tensors in {WEIGHTS_FILE}")
        return cls(weights, rank, scale, str(path))

    def merge_into(self, model: torch.nn.Module) -> torch.nn.Module:
        """W += scale B A on each adapted module of `model` (its unfused module paths), in place; returns it."""
        with torch.no_grad():
            for module, (a, b) in self.weights.items():
                weight = model.get_submodule(module).weight
                weight += (self.scale * b.to(weight) @ a.to(weight))
        return model

    def save(self, path: str | Path, base_model: str = "") -> None:
        """PEFT's layout (what `peft.PeftModel.from_pretrained` reads), scale as lora_alpha = scale * r."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        targets = sorted({m.rsplit(".", 1)[-1] for m in self.weights})
        (path / CONFIG_FILE).write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.scale * self.rank,
            "target_modules": targets, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "base_model_name_or_path": base_model}, indent=2))
        tensors = {}
        for module, (a, b) in self.weights.items():
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = a.contiguous()
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = b.contiguous()
        save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
