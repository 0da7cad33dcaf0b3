"""The model contract: what the inference engine and the trainer rely on, whatever the family (GPT-2, Llama, ...).

    ModelConfig        the shape facts (`model.config`) the KV cache, the memory budget and the samplers read
    LanguageModel      forward with the engine's keywords, the head, tying, the config
    FusesProjections   optional: fuse_projections() (q/k/v -> one matmul); the runner and trainer call it when present
    HasRopeTables      optional: rope_tables(device); the fused decode step (infer/fused_step.py) reads them

A new family implements LanguageModel (and the optional parts it can) and passes tests/model/test_contract.py,
which builds every family small and checks each member's meaning, not only its presence. The Protocols are
runtime_checkable, so `isinstance(model, LanguageModel)` checks the members exist (Python cannot check their
signatures); the test checks what they do.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn as nn

from tinystack.model.attention import KVCache


@runtime_checkable
class ModelConfig(Protocol):
    """`model.config`: named the same for every family (GPT-2's own names, n_embd and block_size, stay too)."""

    vocab_size: int  # token ids are 0 .. vocab_size - 1; logits have this last dimension

    @property
    def n_layer(self) -> int:
        """Transformer blocks: the KV cache keeps one K and one V per layer."""
        ...

    @property
    def n_head(self) -> int:
        """Query heads per layer (the memory budget sizes one layer's attention scores with it)."""
        ...

    @property
    def n_kv_head(self) -> int:
        """Key/value heads per layer (n_head for GPT-2; fewer under grouped-query attention), dividing n_head."""
        ...

    @property
    def head_dim(self) -> int:
        """The size of one head's q, k and v vectors: a KV cache slot is [n_kv_head, head_dim] per layer."""
        ...

    @property
    def max_seq_len(self) -> int:
        """The most positions the model has embeddings (or rotary tables) for: no sequence may be longer."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-serialisable: what the model directory's lineage records."""
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """A causal language model as the engine (infer/) and the trainer (train/) use it: an nn.Module with these."""

    config: ModelConfig
    lm_head: nn.Module  # the output projection: .weight [vocab_size, hidden]; logits = head(final norm's output)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                positions: torch.Tensor | None = None, logit_index: torch.Tensor | None = None,
                apply_head: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] token ids -> (logits [B, T, vocab_size], mean cross-entropy against `targets` or None).

        targets [B, T]: next-token ids, -100 where nothing is predicted (the one ignore index).
        kv_cache: the engine's BatchView; every layer calls kv_cache.attend(layer, q, k, v), which stores this
            step's keys/values and attends each query over its own sequence's history.
        positions [B, T]: where each token sits (default 0..T-1); a cached step feeds only its new tokens.
        logit_index [B] (one position per row; with B = 1 and a packed batch, [R] positions of the one row):
            logits only there -> [R, 1, V]; a bool [B, T] mask: only where True -> [K, 1, V], row-major.
        apply_head=False: the final norm's output [.., hidden] in place of the logits (targets not allowed), for
            a loss that applies a frozen head itself (train/frozen_head.py).
        Raises ValueError when positions would run past config.max_seq_len without `positions` given."""
        ...

    def tie_weights(self) -> None:
        """Make the tied head and embedding one Parameter again (after a loader replaced parameters); a no-op for
        an untied model."""
        ...

    def num_params(self) -> int:
        """Parameter count (tied parameters once)."""
        ...


@runtime_checkable
class FusesProjections(Protocol):
    def fuse_projections(self) -> None:
        """Replace layers that read the same input by one (model/fused_linear.py): the same logits from fewer
        matmuls, state_dict names unchanged; idempotent."""
        ...


@runtime_checkable
class HasRopeTables(Protocol):
    def rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [max_seq_len, head_dim] float32: the rotation the model's forward applies at each
        position (model/llama.rotary_table's layout), so a fast path applies exactly the same one."""
        ...
