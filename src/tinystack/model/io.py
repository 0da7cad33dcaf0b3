"""The model directory: the one format training, evaluation, inference and serving share.

    model_dir/
      config.json         Hugging Face GPT-2 config (model_type "gpt2", n_positions, n_embd, ...)
      model.safetensors   weights under GPT-2's names (Conv1D layout: Linear weights stored [in, out])
      tokenizer.json      the tokenizer (tinystack.tokenizer's file)
      tinystack.json      lineage: data manifest hash, tokenizer hash, training config, final metrics

Because config and weights follow GPT-2's layout exactly, a directory written here
loads in `transformers.GPT2LMHeadModel.from_pretrained`, and a Hugging Face GPT-2
safetensors checkpoint loads here. Every file is written atomically.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from tinystack.atomic import atomic_open, read_json, write_json
from tinystack.model.gpt import GPT, GPTConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LINEAGE_FILE = "tinystack.json"

# GPT-2 stores these as Conv1D, i.e. the transpose of torch.nn.Linear's [out, in].
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class ModelFormatError(ValueError):
    """A model directory is missing files or tensors, or has an unsupported model_type."""


def hf_config(cfg: GPTConfig, eos_token_id: int | None) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "tie_word_embeddings": True,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }


def config_from_hf(hf: dict[str, Any]) -> GPTConfig:
    model_type = hf.get("model_type")
    if model_type != "gpt2":
        raise ModelFormatError(f"unsupported model_type {model_type!r} (supported: 'gpt2')")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ModelFormatError(f"unsupported activation_function {hf['activation_function']!r}")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        raise ModelFormatError(f"unsupported n_inner={hf['n_inner']} (only 4 * n_embd)")
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf.get("n_positions", hf.get("n_ctx", 1024)),
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        dropout=0.0,  # inference: dropout is off; training sets it from its own config
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


def save_model(model: GPT, model_dir: str | Path, *, eos_token_id: int | None = None,
               lineage: dict[str, Any] | None = None) -> Path:
    """Write config.json, model.safetensors (and tinystack.json if lineage is given)."""
    model_dir = Path(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":  # tied to transformer.wte.weight; GPT-2 checkpoints omit it
            continue
        t = t.detach().to("cpu", torch.float32)
        tensors[name] = (t.t() if name.endswith(_CONV1D_SUFFIXES) else t).contiguous()
    with atomic_open(model_dir / WEIGHTS_FILE, "wb") as f:
        f.write(safetensors_bytes(tensors, metadata={"format": "pt"}))
    write_json(model_dir / CONFIG_FILE, hf_config(model.config, eos_token_id))
    if lineage is not None:
        write_json(model_dir / LINEAGE_FILE, lineage)
    return model_dir


def load_model(model_dir: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> GPT:
    """Load a GPT from a model directory (ours or a Hugging Face GPT-2 one), in eval mode."""
    model_dir = Path(model_dir)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (model_dir / name).is_file():
            raise ModelFormatError(f"{model_dir}: missing {name}")
    cfg = config_from_hf(read_json(model_dir / CONFIG_FILE))
    raw = load_file(str(model_dir / WEIGHTS_FILE))
    # Hugging Face's hub checkpoints name GPT2Model's tensors without the "transformer." prefix
    raw = {(k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v for k, v in raw.items()}
    model = GPT(cfg)
    expected = {k for k in model.state_dict() if k != "lm_head.weight"}
    missing = sorted(expected - raw.keys())
    if missing:
        raise ModelFormatError(f"{model_dir / WEIGHTS_FILE}: missing tensors {missing[:8]}"
                               + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    state = {k: (raw[k].t() if k.endswith(_CONV1D_SUFFIXES) else raw[k]) for k in expected}
    for k, v in state.items():
        want = model.state_dict()[k].shape
        if v.shape != want:
            raise ModelFormatError(f"{model_dir}: tensor {k} has shape {tuple(v.shape)}, config implies {tuple(want)}")
    model.load_state_dict(state, strict=False)  # lm_head.weight is tied, so it is filled via wte
    return model.to(device=device, dtype=dtype).eval()


def read_lineage(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / LINEAGE_FILE
    return read_json(path) if path.is_file() else {}
