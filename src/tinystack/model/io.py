"""The model directory: the one format training, evaluation, inference and serving share.

    model_dir/
      config.json         Hugging Face GPT-2 config (model_type "gpt2", n_positions, n_embd, ...)
      model.safetensors   weights under GPT-2's names (Conv1D layout: Linear weights stored [in, out])
      tokenizer.json      the tokenizer (tinystack.tokenizer's file)
      tinystack.json      lineage: data manifest hash, tokenizer hash, training config, final metrics

Because config and weights follow GPT-2's layout exactly, a directory written here
loads in `transformers.GPT2LMHeadModel.from_pretrained`, and a Hugging Face GPT-2
safetensors checkpoint loads here. Llama-family checkpoints (model_type "llama",
"qwen2", "qwen3" (per-head q/k norms), "mistral"; without sliding windows) load into `model.llama.Llama`; weights may
be one `model.safetensors` or shards listed in `model.safetensors.index.json`. A Llama
is saved in the same Hugging Face layout (its parameter names are already HF's), so a
fine-tuned Llama is an ordinary model directory. Every file is written atomically.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from tinystack.atomic import atomic_open, read_json, write_json
from tinystack.model.gpt import GPT, GPTConfig
from tinystack.model.llama import Llama, LlamaConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LINEAGE_FILE = "tinystack.json"
INDEX_FILE = "model.safetensors.index.json"
LLAMA_TYPES = ("llama", "qwen2", "qwen3", "mistral")
SUPPORTED_TYPES = ("gpt2",) + LLAMA_TYPES

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
        supported = ", ".join(map(repr, SUPPORTED_TYPES))
        raise ModelFormatError(f"unsupported model_type {model_type!r} (supported: {supported})")
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


def save_model(model: GPT | Llama, model_dir: str | Path, *, eos_token_id: int | None = None,
               lineage: dict[str, Any] | None = None) -> Path:
    """Write config.json, model.safetensors in float32 (and tinystack.json if lineage is given)."""
    model_dir = Path(model_dir)
    is_gpt = isinstance(model, GPT)
    tied = is_gpt or model.config.tie_word_embeddings  # GPT-2 is always tied; checkpoints omit the head
    tensors: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue
        t = t.detach().to("cpu", torch.float32)
        tensors[name] = (t.t() if is_gpt and name.endswith(_CONV1D_SUFFIXES) else t).contiguous()
    with atomic_open(model_dir / WEIGHTS_FILE, "wb") as f:
        f.write(safetensors_bytes(tensors, metadata={"format": "pt"}))
    config = (hf_config(model.config, eos_token_id) if is_gpt
              else llama_hf_config(model.config, eos_token_id=eos_token_id))
    write_json(model_dir / CONFIG_FILE, config)
    if lineage is not None:
        write_json(model_dir / LINEAGE_FILE, lineage)
    return model_dir


# the RoPE scalings the model implements (model/llama.rope_inv_freq) and the numbers each needs
ROPE_SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def llama_config_from_hf(hf: dict[str, Any]) -> LlamaConfig:
    """A Llama-family config.json -> LlamaConfig; refuses what the model does not implement."""
    model_type = hf.get("model_type")
    rope = hf.get("rope_parameters") or {}  # transformers >= 5 nests rope settings here
    scaling = hf.get("rope_scaling") or rope  # transformers 4 keeps the scaling apart, under rope_scaling
    rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
    if rope_type not in ROPE_SCALING_KEYS:
        raise ModelFormatError(f"unsupported rope scaling {rope_type!r} (plain RoPE, 'linear' or 'llama3')")
    missing = [k for k in ROPE_SCALING_KEYS[rope_type] if scaling.get(k) is None]
    if missing:
        raise ModelFormatError(f"rope scaling {rope_type!r} lacks {', '.join(map(repr, missing))}")
    numbers = {k: (int if k.startswith("original") else float)(scaling[k]) for k in ROPE_SCALING_KEYS[rope_type]}
    rope_scaling = {"rope_type": rope_type, **numbers} if rope_type != "default" else None
    if hf.get("hidden_act", "silu") != "silu":
        raise ModelFormatError(f"unsupported hidden_act {hf['hidden_act']!r} (only 'silu')")
    if model_type == "mistral" and hf.get("sliding_window"):
        raise ModelFormatError("unsupported: mistral sliding_window attention")
    if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        raise ModelFormatError(f"unsupported: {model_type} use_sliding_window attention")
    try:
        return LlamaConfig(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
            n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
            n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"], head_dim=hf.get("head_dim") or 0,
            max_position_embeddings=hf.get("max_position_embeddings", 2048), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0), rope_scaling=rope_scaling,
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            mlp_bias=bool(hf.get("mlp_bias", False)), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            model_type=model_type)
    except KeyError as e:
        raise ModelFormatError(f"config.json for model_type {model_type!r} lacks {e.args[0]!r}") from None


def llama_hf_config(cfg: LlamaConfig, bos_token_id: int | None = None,
                    eos_token_id: int | list[int] | None = None) -> dict[str, Any]:
    """LlamaConfig -> config.json as transformers writes it for LlamaForCausalLM / Qwen2ForCausalLM.

    `rope_theta` at the top level: transformers 4.x reads it there and 5.x moves it into rope_parameters."""
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "mistral": "MistralForCausalLM"}
    return {
        "model_type": cfg.model_type, "architectures": [arch[cfg.model_type]], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "hidden_act": "silu",
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias, "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "torch_dtype": "float32",
        **({"sliding_window": None} if cfg.model_type == "mistral" else {}),  # transformers' default is 4096
    }


def _read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    if (model_dir / WEIGHTS_FILE).is_file():
        return load_file(str(model_dir / WEIGHTS_FILE))
    if (model_dir / INDEX_FILE).is_file():
        shards = sorted(set(read_json(model_dir / INDEX_FILE)["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(str(model_dir / shard)))
        return out
    raise ModelFormatError(f"{model_dir}: missing {WEIGHTS_FILE}")


# tensors a checkpoint may carry that change nothing: RoPE's and GPT-2's attention-mask buffers (older files)
_HARMLESS_EXTRA = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def check_tensor_shapes(model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], where: Path | str) -> list[str]:
    """Every tensor `model` needs is in `shapes` with its shape, and every tensor in `shapes` has a place in
    `model` (a weight dropped would leave a different model than the file's: a wrong model_type, say), else
    ModelFormatError naming them; returns the names needed (a tied head is not: a copy of it in the file is
    ignored, as are _HARMLESS_EXTRA buffers). `model` may live on the meta device: only shapes are read."""
    own = model.state_dict()
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", isinstance(model, GPT)) else set()
    expected = [k for k in own if k not in tied]
    missing = [k for k in expected if k not in shapes]
    if missing:
        raise ModelFormatError(f"{where}: missing tensors {missing[:8]}"
                               + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    extra = sorted(k for k in shapes if k not in own and not k.endswith(_HARMLESS_EXTRA))
    if extra:
        raise ModelFormatError(f"{where}: tensors the {getattr(model.config, 'model_type', 'gpt2')} model has no "
                               f"place for: {extra[:6]}" + (f" and {len(extra) - 6} more" if len(extra) > 6 else ""))
    for k in expected:
        if tuple(shapes[k]) != tuple(own[k].shape):
            raise ModelFormatError(f"{where}: tensor {k} has shape {tuple(shapes[k])}, "
                                   f"config implies {tuple(own[k].shape)}")
    return expected


_INIT_FUNCTIONS = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_")
_init_lock = threading.Lock()


@contextmanager
def _meta_init_skipped() -> Iterator[None]:
    """torch.nn.init's functions return meta tensors untouched (every other tensor is initialised as usual, so
    another thread building a real model meanwhile is unaffected). On meta they compute nothing anyway, but the
    first meta normal_ of a process imports sympy (seconds of start-up)."""
    with _init_lock:
        saved = {name: getattr(torch.nn.init, name) for name in _INIT_FUNCTIONS}

        def skipping(fn: Any) -> Any:
            return lambda t, *a, **k: t if t.is_meta else fn(t, *a, **k)

        try:
            for name, fn in saved.items():
                setattr(torch.nn.init, name, skipping(fn))
            yield
        finally:
            for name, fn in saved.items():
                setattr(torch.nn.init, name, fn)


def empty_model(cfg: GPTConfig | LlamaConfig) -> GPT | Llama:
    """The model's module tree with every tensor on the meta device: shapes without memory or random values
    (a loader fills it from a file; building a real 135M-parameter model spends seconds on an initialisation
    the file overwrites)."""
    with _meta_init_skipped(), torch.device("meta"):
        return Llama(cfg) if isinstance(cfg, LlamaConfig) else GPT(cfg)


def _check_and_load(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Fill `model` (an empty_model) from `state`: uninitialised memory, then every tensor copied in (so the
    parameters own their memory, contiguous, in the model's dtype, not views of the file's mapping)."""
    expected = check_tensor_shapes(model, {k: tuple(v.shape) for k, v in state.items()}, where)
    model.to_empty(device="cpu")  # replaces the parameters: a tied head is tied again below
    model.load_state_dict({k: state[k] for k in expected}, strict=False)
    model.tie_weights()


def load_model(model_dir: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> GPT | Llama:
    """Load a model directory (ours, or Hugging Face GPT-2 / Llama-family safetensors), in eval mode."""
    model_dir = Path(model_dir)
    if not (model_dir / CONFIG_FILE).is_file():
        raise ModelFormatError(f"{model_dir}: missing {CONFIG_FILE}")
    hf = read_json(model_dir / CONFIG_FILE)
    if hf.get("quantization_config"):  # GPTQ / AWQ / bitsandbytes / fp8 tensors are not plain float weights
        method = hf["quantization_config"].get("quant_method", "unknown")
        raise ModelFormatError(f"{model_dir}: unsupported quantization {method!r} (only unquantised float weights "
                               "load; GGUF files import with `tinystack model import`)")
    if hf.get("model_type") in LLAMA_TYPES:
        model: GPT | Llama = empty_model(llama_config_from_hf(hf))
        raw = _read_weights(model_dir)
        _check_and_load(model, raw, model_dir)
    else:
        cfg = config_from_hf(hf)
        raw = _read_weights(model_dir)
        # Hugging Face's hub checkpoints name GPT2Model's tensors without the "transformer." prefix
        raw = {(k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v for k, v in raw.items()}
        raw = {k: (v.t() if k.endswith(_CONV1D_SUFFIXES) else v) for k, v in raw.items()}
        model = empty_model(cfg)
        _check_and_load(model, raw, model_dir / WEIGHTS_FILE)
    return model.to(device=device, dtype=dtype).eval()


def read_lineage(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / LINEAGE_FILE
    return read_json(path) if path.is_file() else {}


def load_chat_template(model_dir: str | Path | None) -> str | None:
    """`model_dir/chat_template.jinja` (where transformers >= 4.49 saves it), else the `chat_template` of
    `model_dir/tokenizer_config.json` (the "default" one if it is a list), else None."""
    if model_dir is None:
        return None
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8") or None
    path = Path(model_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None
