"""A GGUF file's model: metadata -> LlamaConfig, tensors -> float32 under Hugging Face's names.

GGUF (llama.cpp's format) is one file: a header of typed key/value metadata, a tensor index,
then the tensor data, each tensor in a ggml type (float or block-quantised, see
gguf_dequant.py). `gguf.GGUFReader` parses the container (plumbing); the mapping is here:

    {arch}.block_count / embedding_length / feed_forward_length   n_layer / hidden_size / intermediate_size
    {arch}.attention.head_count / head_count_kv / key_length      n_head / n_kv_head / head_dim
    {arch}.rope.freq_base, .attention.layer_norm_rms_epsilon      rope_theta, rms_norm_eps
    {arch}.context_length                                         max_position_embeddings
    no `output.weight` tensor                                     tie_word_embeddings
    token_embd / output_norm / output                             model.embed_tokens / model.norm / lm_head
    blk.N.attn_{norm,q,k,v,output}                                model.layers.N.input_layernorm,
                                                                  model.layers.N.self_attn.{q,k,v,o}_proj
    blk.N.ffn_{norm,gate,up,down}                                 model.layers.N.post_attention_layernorm, mlp.*_proj
    blk.N.attn_{q,k}_norm (qwen3)                                 model.layers.N.self_attn.{q,k}_norm

GGUF stores dims fastest-first (`[in, out]` for a weight); NumPy's shape is that reversed.

**The Q/K permutation.** llama.cpp rotates pairs of *adjacent* dimensions (2i, 2i+1) of each
head; Hugging Face's Llama rotates dimension i with i + head_dim/2 (the two halves). To run HF
weights, llama.cpp's converter permutes the rows of q_proj and k_proj (weight and bias) within
every head: row h*hd + 2i + j (j = 0, 1) of the GGUF tensor is row h*hd + j*hd/2 + i of the HF
one. We undo it: view the rows as [heads, hd/2, 2], swap the last two axes, flatten. Qwen2 files
are not permuted (llama.cpp runs them with the "NEOX" half-split rotation, the same as HF's).

**RoPE scaling.** `rope.scaling.type` linear -> rope_scaling linear. Llama 3.1+'s scaling reaches GGUF only
as a `rope_freqs` tensor: the divisor of each frequency, which llama.cpp's converter computes from the llama3
parameters with its own fixed low_freq_factor 1, high_freq_factor 4 and original context 8192
(LLAMA3_CONVERTER). config.json needs the parameters, so the import takes factor = the largest divisor and
keeps the result only if those parameters give back every divisor (model/llama.rope_inv_freq).

Anything we do not implement is refused with its name, never dropped: another architecture, a
mixture of experts, other RoPE scalings (or `rope_freqs` no llama3 parameters give), partial rotary, a
tensor we have no name for, a ggml type without a dequantiser.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tinystack.model.gguf_dequant import SUPPORTED_TYPES, dequantize, type_name
from tinystack.model.io import ModelFormatError
from tinystack.model.llama import LlamaConfig, rope_inv_freq

# GGUF architecture -> (our model_type, are Q/K rows permuted?)
ARCHITECTURES = {"llama": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False)}
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+'s RoPE scaling: one divisor per frequency (module docstring)
# the llama3 parameters llama.cpp's converter computes rope_freqs with, besides the factor (fixed in its code)
LLAMA3_CONVERTER = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_MISSING = object()


def hf_tensor_name(name: str) -> str | None:
    """GGUF tensor name -> Hugging Face name, or None if it is not one we know."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLOCK_RE.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's per-head Q/K row permutation (adjacent pairs -> halves); w is [rows, ...]."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_reader(path: Path):
    """gguf.GGUFReader over `path` (memory-mapped), with a one-line error for a bad file.

    The reader slices its memory map once per metadata value, ~1 M times for a 49k-word vocabulary and its
    merges, and each slice of numpy's memmap subclass runs Python hooks (__array_finalize__, __getitem__): those
    hooks were most of the open (BENCHMARKS.md, Model import). So the reader is given a plain ndarray view of the
    same mapping (no copy; read-only)."""
    from gguf import GGUFReader  # deferred: a few hundred ms, paid only by GGUF imports

    class PlainViewReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain = np.asarray(mapped)  # memmap -> its base-class view: same pages, no subclass hooks

    try:
        return PlainViewReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:  # bad magic, truncated index, ...
        raise ModelFormatError(f"{path}: not a readable GGUF file ({e})") from None


class GGUFModel:
    """The model inside one GGUF file: `config` (LlamaConfig), `metadata(key)`, `tensors()`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.reader = open_reader(self.path)
        self.arch = self.metadata("general.architecture", None)
        if self.arch not in ARCHITECTURES:
            raise ModelFormatError(f"{self.path}: unsupported GGUF architecture {self.arch!r} "
                                   f"(supported: {', '.join(ARCHITECTURES)})")
        self.model_type, self.permuted = ARCHITECTURES[self.arch]
        self._check_tensors()
        self.config = self._config()

    def metadata(self, key: str, default: Any = _MISSING) -> Any:
        field = self.reader.get_field(key)
        if field is None:
            if default is _MISSING:
                raise ModelFormatError(f"{self.path}: GGUF metadata lacks {key!r}")
            return default
        return field.contents()

    def _arch(self, key: str, default: Any = _MISSING) -> Any:
        return self.metadata(f"{self.arch}.{key}", default)

    def _check_tensors(self) -> None:
        names = {t.name for t in self.reader.tensors}
        unknown = sorted(n for n in names if hf_tensor_name(n) is None and n != ROPE_FREQS)
        self.weights = [t for t in self.reader.tensors if t.name != ROPE_FREQS]  # the model's, in file order
        if unknown:
            raise ModelFormatError(f"{self.path}: unsupported tensors {unknown[:6]}"
                                   + (f" and {len(unknown) - 6} more" if len(unknown) > 6 else ""))
        bad = sorted({type_name(t.tensor_type) for t in self.reader.tensors} - set(SUPPORTED_TYPES))
        if bad:
            raise ModelFormatError(f"{self.path}: unsupported GGUF tensor type {', '.join(bad)} "
                                   f"(supported: {', '.join(SUPPORTED_TYPES)})")
        self.tied = "output.weight" not in names

    def _config(self) -> LlamaConfig:
        if experts := self._arch("expert_count", 0):
            raise ModelFormatError(f"{self.path}: unsupported: mixture of experts ({experts} experts)")
        n_head = self._arch("attention.head_count")
        n_kv = self._arch("attention.head_count_kv", n_head)
        if isinstance(n_kv, list) or isinstance(n_head, list):
            raise ModelFormatError(f"{self.path}: unsupported: a different head count per layer")
        hidden = self._arch("embedding_length")
        head_dim = self._arch("attention.key_length", hidden // n_head)
        if self._arch("attention.value_length", head_dim) != head_dim:
            raise ModelFormatError(f"{self.path}: unsupported: value heads of another size than key heads")
        if self._arch("rope.dimension_count", head_dim) != head_dim:
            raise ModelFormatError(f"{self.path}: unsupported: partial rotary "
                                   f"({self._arch('rope.dimension_count')} of {head_dim} dims)")
        embd = next(t for t in self.reader.tensors if t.name == "token_embd.weight")
        return LlamaConfig(
            vocab_size=int(embd.shape[1]), hidden_size=hidden, intermediate_size=self._arch("feed_forward_length"),
            n_layer=self._arch("block_count"), n_head=n_head, n_kv_head=n_kv, head_dim=head_dim,
            max_position_embeddings=self._arch("context_length", 2048),
            rms_norm_eps=float(self._arch("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(self._arch("rope.freq_base", 10000.0)),
            rope_scaling=self._rope_scaling(head_dim, float(self._arch("rope.freq_base", 10000.0))),
            attention_bias=self.model_type == "qwen2" or any(t.name.endswith("attn_q.bias") for t in self.weights),
            qk_norm=self.model_type == "qwen3",
            tie_word_embeddings=self.tied, model_type=self.model_type)

    def _rope_scaling(self, head_dim: int, theta: float) -> dict[str, Any] | None:
        """LlamaConfig.rope_scaling from `rope.scaling.*` or the rope_freqs tensor (module docstring)."""
        kind, factor = self._arch("rope.scaling.type", "none"), float(self._arch("rope.scaling.factor", 1.0))
        freqs = next((t for t in self.reader.tensors if t.name == ROPE_FREQS), None)
        if kind not in ("none", "linear") and factor != 1.0:
            raise ModelFormatError(f"{self.path}: unsupported rope scaling {kind!r} (plain RoPE, linear, llama3)")
        if kind == "linear" and factor != 1.0:
            if freqs is not None:
                raise ModelFormatError(f"{self.path}: unsupported: linear rope scaling and a rope_freqs tensor")
            return {"rope_type": "linear", "factor": factor}
        if freqs is None:
            return None
        if tuple(int(d) for d in freqs.shape) != (head_dim // 2,):
            raise ModelFormatError(f"{self.path}: rope_freqs has shape {list(freqs.shape)}, not [{head_dim // 2}]")
        divisors = torch.from_numpy(dequantize(freqs.data, freqs.tensor_type, (head_dim // 2,)).astype(np.float32))
        if torch.all(divisors == 1):
            return None
        params = {"rope_type": "llama3", "factor": float(divisors.max()), **LLAMA3_CONVERTER}
        if not torch.allclose(rope_inv_freq(head_dim, theta, params), rope_inv_freq(head_dim, theta) / divisors,
                              rtol=1e-5, atol=0):
            raise ModelFormatError(f"{self.path}: unsupported RoPE scaling: rope_freqs that no llama3 parameters "
                                   f"give (factor {params['factor']:g}, low/high freq factor 1/4, original 8192)")
        return params

    def file_type(self) -> str:
        """The ggml types of the tensors, most common first (e.g. "Q4_1, F32, Q8_0")."""
        counts: dict[str, int] = {}
        for t in self.reader.tensors:
            counts[type_name(t.tensor_type)] = counts.get(type_name(t.tensor_type), 0) + 1
        return ", ".join(sorted(counts, key=lambda k: -counts[k]))

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """[(Hugging Face name, NumPy shape)] in file order, read from the index alone (no tensor data)."""
        return [(hf_tensor_name(t.name), tuple(int(d) for d in reversed(t.shape))) for t in self.weights]

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(Hugging Face name, float32 array in HF layout), one tensor at a time, in `shapes()` order."""
        c = self.config
        for t, (name, shape) in zip(self.weights, self.shapes()):
            w = dequantize(t.data, t.tensor_type, shape)
            if self.permuted and ".self_attn.q_proj." in name:
                w = unpermute_rows(w, c.n_head)
            elif self.permuted and ".self_attn.k_proj." in name:
                w = unpermute_rows(w, c.n_kv_head)
            yield name, np.ascontiguousarray(w)
