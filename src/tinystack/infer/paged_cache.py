"""KV memory in blocks, and the per-step view through which a packed batch reads and writes it.

Storage: K and V tensors of shape [n_layer, num_blocks, block_size, n_kv_head, head_dim].
The contiguous cache is the same storage with block_size = max_seq_len and one block
per sequence (preallocated to the full context); the paged cache uses small blocks
(default 16 tokens) handed out by the BlockManager.

A step runs R sequences, row r feeding n_r new tokens at positions p_r..p_r+n_r-1.
The rows are PACKED, not padded: the model sees one row of N = sum(n_r) tokens
(ids [1, N], `positions` [1, N]), so a 400-token prefill chunk next to 63 one-token
decodes costs 463 token-rows in every linear layer, not 64 x 400.
`BatchView.attend(layer, q, k, v)` is the attention over the cache, per sequence:
  write:  the N new keys/values go to their slots (block_table[pos // bs] * bs + pos % bs)
  read:   row r's keys 0..p_r+n_r-1: a view when its blocks are consecutive in storage
          (always for the contiguous cache), else a gather of just that row's blocks
  attend: its n_r queries against them (causal within the chunk), one SDPA call per row.
Why per row and not one padded [R, S_max] gather: at decode, attention is bound by
reading the cache; padding every row to the longest context and gathering it into a
new tensor moved ~8x more bytes than reading each row's own keys where they lie.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tinystack.infer.weight_arena import hugepage_empty


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, hugepages: bool) -> torch.Tensor:
    """Zeros; on the CPU in 2 MiB pages, mapped lazily (decode reads the cache every step, like the weights)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return hugepage_empty(nbytes, hugepages).view(dtype).view(shape)


class KVStorage:
    def __init__(self, n_layer: int, num_blocks: int, block_size: int, n_kv_head: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", hugepages: bool = True):
        shape = (n_layer, num_blocks, block_size, n_kv_head, head_dim)
        self.k, self.v = (_zeros(shape, dtype, torch.device(device), hugepages) for _ in "kv")
        self.block_size = block_size

    @staticmethod
    def bytes_per_block(n_layer: int, block_size: int, n_kv_head: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * n_layer * block_size * n_kv_head * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class BatchView:
    """The cache as one step's model call sees it. Built by the ModelRunner, used for every layer.

    `positions` [1, N] and `last_index` [R] (each row's last token in the packed order) are
    what the model needs besides the ids; `offsets[r]` is where row r starts in the packing.
    """

    def __init__(self, storage: KVStorage, block_tables: list[list[int]], starts: list[int], lengths: list[int],
                 device: torch.device):
        bs = storage.block_size
        self.storage = storage
        self.starts, self.lengths = list(starts), list(lengths)
        self.offsets = [0]
        for n in lengths[:-1]:
            self.offsets.append(self.offsets[-1] + n)
        slots, pos = [], []
        self.reads: list[tuple[int, int] | torch.Tensor] = []  # per row: (first slot, S) view, or block ids
        for s, n, table in zip(starts, lengths, block_tables):
            slots.extend(table[p // bs] * bs + p % bs for p in range(s, s + n))
            pos.extend(range(s, s + n))
            S = s + n
            nblk = -(-S // bs)
            if all(table[i] == table[0] + i for i in range(nblk)):
                self.reads.append((table[0] * bs, S))
            else:
                self.reads.append(torch.tensor(table[:nblk], dtype=torch.long, device=device))
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)
        self.positions = torch.tensor([pos], dtype=torch.long, device=device)
        self.last_index = torch.tensor([o + n - 1 for o, n in zip(self.offsets, lengths)], dtype=torch.long,
                                       device=device)

    def _history(self, store: torch.Tensor, r: int) -> torch.Tensor:
        """Row r's keys (or values) 0..S-1 from one layer's store -> [1, nkv, S, hd]."""
        read, S = self.reads[r], self.starts[r] + self.lengths[r]
        if isinstance(read, tuple):
            first = read[0]
            rows = store.view(-1, *store.shape[2:])[first: first + S]  # a view: nothing copied
        else:
            rows = store[read].flatten(0, 1)[:S]  # [nblk * bs -> S, nkv, hd], only this row's blocks
        return rows.transpose(0, 1)[None]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, nh, N, hd], k/v [1, nkv, N, hd] of the packed new tokens -> attention output [1, nh, N, hd]."""
        st = self.storage
        kl, vl = st.k[layer], st.v[layer]
        for store, new in ((kl, k), (vl, v)):
            store.view(-1, *store.shape[2:]).index_copy_(0, self.slots, new[0].transpose(0, 1))
        gqa = k.size(1) != q.size(1)
        if len(self.lengths) == 1:
            return self._attend_row(0, q, kl, vl, gqa)
        out = torch.empty_like(q)
        for r, (o, n) in enumerate(zip(self.offsets, self.lengths)):
            out[:, :, o:o + n] = self._attend_row(r, q[:, :, o:o + n], kl, vl, gqa)
        return out

    def _attend_row(self, r: int, q: torch.Tensor, kl: torch.Tensor, vl: torch.Tensor, gqa: bool) -> torch.Tensor:
        keys, values = self._history(kl, r), self._history(vl, r)
        n, S = q.size(2), keys.size(2)
        if n == 1:  # a decode: the new token sees every key
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=gqa)
        if n == S:  # a whole prompt from position 0: the plain causal triangle
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=gqa)
        # a prefill chunk at positions S-n..S-1: each query sees keys up to its own position
        mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(S - n, S, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
