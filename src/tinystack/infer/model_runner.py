"""Runs the model for one scheduled step: a ragged batch in, next-token logits out.

    [(seq, n), ...] -> ids [1, N]: every row's n new tokens from seq.num_computed on, PACKED
                       one after another (no padding; N = sum of n)
                    -> BatchView over the KV storage (writes the new K/V, attends per sequence)
                    -> model(ids, kv_cache=view, positions=[1, N], logit_index=each row's last token)
                    -> logits [R, V] at each row's last fed token

Prefill chunks and single-token decodes share one call; only the rows' last
positions go through the output head. Rows of LoRA adapters (infer/lora.py) tag each packed token with its
row's adapter, so every projection adds the right delta to the right rows. Every step of fewer than
GEMM_MIN_ROWS tokens (every decode step, speculative verification, short prefill chunks) goes to FusedStep where
the model allows (fused_step.py: all layers in one C++ call, no per-layer Python, adapter deltas included); the
model's forward above stays its reference and runs the long steps.
At start-up the runner fuses the model's projections where it can (Llama: QKV and gate/up,
model.fuse_projections), then moves its weights into one arena of 2 MiB pages with the head column-major
(weight_arena.py): decode is bound by streaming the weights, and that is where the stream runs fastest.
"""
from __future__ import annotations

import itertools

import torch

from tinystack.infer.fused_step import FusedStep
from tinystack.infer.lora import AdapterSet
from tinystack.infer.paged_cache import BatchView, KVStorage
from tinystack.infer.sequence import Sequence
from tinystack.infer.weight_arena import ArenaReport, place_weights


class ModelRunner:
    def __init__(self, model: torch.nn.Module, storage: KVStorage, device: str | torch.device = "cpu",
                 hugepages: bool = True, fused_step: bool = True):
        self.model = model
        self.storage = storage
        self.device = torch.device(device)
        if hasattr(model, "fuse_projections"):  # fewer, larger matmuls per layer; before the weights are placed
            model.fuse_projections()
        # decode streams every weight once per step: 2 MiB pages and a column-major head (weight_arena.py)
        self.arena: ArenaReport | None = place_weights(model, hugepages)
        # short steps (decodes, verification, small prefill chunks): every layer in one C++ call (fused_step.py)
        self.fused = FusedStep.build(model, storage, self.device) if fused_step else None
        self.loras: AdapterSet | None = None  # LoRA adapters, once one is loaded (LLMEngine.add_lora)

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """-> logits [R, V] at each row's last token. With `drafts` (speculative.py), row r also feeds
        drafts[r] after its n tokens and gets logits at its last 1 + len(drafts[r]) positions, row after row."""
        if getattr(self.model, "needs_full_sequence", False):  # a backend without a KV cache (numpy_backend)
            return torch.stack([self.model.last_logits(seq.token_ids[: seq.num_computed + n]) for seq, n in batch])
        drafts = drafts or [[] for _ in batch]
        starts = [seq.num_computed for seq, _ in batch]
        lengths = [n + len(d) for (_, n), d in zip(batch, drafts)]
        ids = [t for (seq, n), d in zip(batch, drafts)
               for t in seq.token_ids[seq.num_computed: seq.num_computed + n] + d]
        ends = list(itertools.accumulate(lengths))  # row r's tokens end at ends[r] in the packing
        index = [e - 1 - j for e, d in zip(ends, drafts) for j in range(len(d), -1, -1)]
        tables = [seq.block_table for seq, _ in batch]
        slots = [seq.lora_key for seq, _ in batch]
        short = self.fused is not None and self.fused.accepts(len(ids))
        if any(slots) and self.loras is not None:  # rows with LoRA adapters: each token's delta added to its row
            if short and self.fused.take_loras(self.loras):
                place = {key: i for i, key in enumerate(self.loras.resident)}
                token_slots = [place[k] if k else -1 for k, n in zip(slots, lengths) for _ in range(n)]
                return self.fused.run(ids, tables, starts, lengths, index, token_slots)
            with self.loras.rows([k for k, n in zip(slots, lengths) for _ in range(n)]):
                return self._forward(ids, tables, starts, lengths, index)
        if short:
            return self.fused.run(ids, tables, starts, lengths, index)
        return self._forward(ids, tables, starts, lengths, index)

    def _forward(self, ids: list[int], tables: list[list[int]], starts: list[int], lengths: list[int],
                 index: list[int]) -> torch.Tensor:
        view = BatchView(self.storage, tables, starts, lengths, self.device)
        logits, _ = self.model(torch.tensor([ids], device=self.device), kv_cache=view, positions=view.positions,
                               logit_index=torch.tensor(index, dtype=torch.long, device=self.device))
        return logits[:, 0]  # [M, 1, V]: x[arange(1), index] picked one position per index
