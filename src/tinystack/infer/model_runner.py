"""Runs the model for one scheduled step: a ragged batch in, next-token logits out.

    [(seq, n), ...] -> ids [1, N]: every row's n new tokens from seq.num_computed on, PACKED
                       one after another (no padding; N = sum of n)
                    -> BatchView over the KV storage (writes the new K/V, attends per sequence)
                    -> model(ids, kv_cache=view, positions=[1, N], logit_index=each row's last token)
                    -> logits [R, V] at each row's last fed token

Prefill chunks and single-token decodes share one call; only the rows' last
positions go through the output head. A step of decodes only (every batch-1 step after the prompt, and
the steady state of continuous batching) goes to FusedDecode where the model allows (fused_decode.py:
all layers in one C++ call, no per-layer Python); the model's forward above stays its reference. At start-up the runner fuses the model's projections
where it can (Llama: QKV and gate/up, model.fuse_projections), then moves its weights
into one arena of 2 MiB pages with the head column-major (weight_arena.py): decode is
bound by streaming the weights, and that is where the stream runs fastest.
"""
from __future__ import annotations

import torch

from tinystack.infer.fused_decode import FusedDecode
from tinystack.infer.paged_cache import BatchView, KVStorage
from tinystack.infer.sequence import Sequence
from tinystack.infer.weight_arena import ArenaReport, place_weights


class ModelRunner:
    def __init__(self, model: torch.nn.Module, storage: KVStorage, device: str | torch.device = "cpu",
                 hugepages: bool = True, fused_decode: bool = True):
        self.model = model
        self.storage = storage
        self.device = torch.device(device)
        if hasattr(model, "fuse_projections"):  # fewer, larger matmuls per layer; before the weights are placed
            model.fuse_projections()
        # decode streams every weight once per step: 2 MiB pages and a column-major head (weight_arena.py)
        self.arena: ArenaReport | None = place_weights(model, hugepages)
        # steps of decodes only: every layer in one C++ call (fused_decode.py), where the model and cache allow
        self.fused = FusedDecode.build(model, storage, self.device) if fused_decode else None

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """-> logits [R, V] at each row's last token. With `drafts` (speculative.py), row r also feeds
        drafts[r] after its n tokens and gets logits at its last 1 + len(drafts[r]) positions, row after row."""
        if getattr(self.model, "needs_full_sequence", False):  # a backend without a KV cache (numpy_backend)
            return torch.stack([self.model.last_logits(seq.token_ids[: seq.num_computed + n]) for seq, n in batch])
        if not drafts and self.fused is not None and self.fused.accepts(batch):
            return self.fused.run(batch)
        drafts = drafts or [[] for _ in batch]
        starts = [seq.num_computed for seq, _ in batch]
        lengths = [n + len(d) for (_, n), d in zip(batch, drafts)]
        ids = [t for (seq, n), d in zip(batch, drafts)
               for t in seq.token_ids[seq.num_computed: seq.num_computed + n] + d]
        view = BatchView(self.storage, [seq.block_table for seq, _ in batch], starts, lengths, self.device)
        index = view.last_index
        if any(drafts):
            index = torch.tensor([o + n - 1 - j for o, n, d in zip(view.offsets, lengths, drafts)
                                  for j in range(len(d), -1, -1)], dtype=torch.long, device=self.device)
        logits, _ = self.model(torch.tensor([ids], device=self.device), kv_cache=view, positions=view.positions,
                               logit_index=index)
        return logits[:, 0]  # [M, 1, V]: x[arange(1), index] picked one position per index
