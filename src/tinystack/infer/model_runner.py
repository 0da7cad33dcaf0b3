"""Runs the model for one scheduled step: a ragged batch in, next-token logits out.

    [(seq, n), ...] -> ids [1, N]: every row's n new tokens from seq.num_computed on, PACKED
                       one after another (no padding; N = sum of n)
                    -> BatchView over the KV storage (writes the new K/V, attends per sequence)
                    -> model(ids, kv_cache=view, positions=[1, N], logit_index=each row's last token)
                    -> logits [R, V] at each row's last fed token

Prefill chunks and single-token decodes share one call; only the rows' last
positions go through the output head. At start-up the runner fuses the model's projections
where it can (Llama: QKV and gate/up, model.fuse_projections), then moves its weights
into one arena of 2 MiB pages with the head column-major (weight_arena.py): decode is
bound by streaming the weights, and that is where the stream runs fastest.
"""
from __future__ import annotations

import torch

from tinystack.infer.paged_cache import BatchView, KVStorage
from tinystack.infer.sequence import Sequence
from tinystack.infer.weight_arena import ArenaReport, place_weights


class ModelRunner:
    def __init__(self, model: torch.nn.Module, storage: KVStorage, device: str | torch.device = "cpu",
                 hugepages: bool = True):
        self.model = model
        self.storage = storage
        self.device = torch.device(device)
        if hasattr(model, "fuse_projections"):  # fewer, larger matmuls per layer; before the weights are placed
            model.fuse_projections()
        # decode streams every weight once per step: 2 MiB pages and a column-major head (weight_arena.py)
        self.arena: ArenaReport | None = place_weights(model, hugepages)

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> torch.Tensor:
        if getattr(self.model, "needs_full_sequence", False):  # a backend without a KV cache (numpy_backend)
            return torch.stack([self.model.last_logits(seq.token_ids[: seq.num_computed + n]) for seq, n in batch])
        starts = [seq.num_computed for seq, _ in batch]
        lengths = [n for _, n in batch]
        ids = [t for seq, n in batch for t in seq.token_ids[seq.num_computed: seq.num_computed + n]]
        view = BatchView(self.storage, [seq.block_table for seq, _ in batch], starts, lengths, self.device)
        logits, _ = self.model(torch.tensor([ids], device=self.device), kv_cache=view, positions=view.positions,
                               logit_index=view.last_index)
        return logits[:, 0]  # [R, 1, V]: x[arange(1), last_index] picked one position per row
