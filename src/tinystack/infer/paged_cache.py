"""KV memory in blocks, and the per-step view through which a ragged batch reads and writes it.

Storage: K and V tensors of shape [n_layer, num_blocks, block_size, n_kv_head, head_dim].
The contiguous cache is the same storage with block_size = max_seq_len and one block
per sequence (preallocated to the full context); the paged cache uses small blocks
(default 16 tokens) handed out by the BlockManager.

A step runs B sequences, row b feeding n_b new tokens at positions p_b..p_b+n_b-1
(padded to T = max n_b). `BatchView.update(layer, k, v)` is the model's cache protocol:
  write:  the valid new keys/values go to their slots (block_table[pos // bs] * bs + pos % bs)
  read:   each row's keys 0..p_b+n_b-1 are gathered through its block table -> [B, nkv, S, hd]
  mask:   `attn_mask` [B, 1, T, S]: query t of row b sees key j iff j <= p_b + t (causal,
          and nothing past the row's own context); None when every key is visible
A single sequence whose blocks are contiguous reads a view, not a copy.
"""
from __future__ import annotations

import torch


class KVStorage:
    def __init__(self, n_layer: int, num_blocks: int, block_size: int, n_kv_head: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        shape = (n_layer, num_blocks, block_size, n_kv_head, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    @staticmethod
    def bytes_per_block(n_layer: int, block_size: int, n_kv_head: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * n_layer * block_size * n_kv_head * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class BatchView:
    """The cache as one step's model call sees it. Built by the ModelRunner, used for every layer."""

    def __init__(self, storage: KVStorage, block_tables: list[list[int]], starts: list[int], lengths: list[int],
                 device: torch.device):
        bs = storage.block_size
        self.storage = storage
        B, T = len(starts), max(lengths)
        ctx = [s + n for s, n in zip(starts, lengths)]
        self.S = max(ctx)
        nblk = -(-self.S // bs)
        # write targets: slot of every valid (row, t), and which padded positions are valid
        slots, valid = [], torch.zeros(B, T, dtype=torch.bool)
        for b, (s, n, table) in enumerate(zip(starts, lengths, block_tables)):
            valid[b, :n] = True
            slots.extend(table[p // bs] * bs + p % bs for p in range(s, s + n))
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)
        self.valid = valid.to(device)
        self.all_valid = bool(valid.all())
        # read: contiguous single-row fast path, else a block-granular gather
        table0 = block_tables[0]
        self.view_block = (table0[0] if B == 1 and all(table0[i] == table0[0] + i for i in range(nblk)) else None)
        self.tables = torch.tensor([t[:nblk] + [0] * (nblk - len(t[:nblk])) for t in block_tables],
                                   dtype=torch.long, device=device)
        positions = torch.tensor([[s + min(t, n - 1) for t in range(T)] for s, n in zip(starts, lengths)],
                                 dtype=torch.long, device=device)  # padding repeats the row's last position
        self.positions = positions
        mask = torch.arange(self.S, device=device)[None, None, :] <= positions[:, :, None]  # [B, T, S]
        self.attn_mask = None if bool(mask.all()) else mask[:, None]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, nkv, T, hd] of the new tokens -> all keys/values of each row [B, nkv, S, hd]."""
        st = self.storage
        out = []
        for store, new in ((st.k[layer], k), (st.v[layer], v)):
            flat = store.view(-1, *store.shape[2:])  # [num_blocks * bs, nkv, hd]
            new = new.transpose(1, 2)  # [B, T, nkv, hd]
            flat.index_copy_(0, self.slots, new.reshape(-1, *new.shape[2:]) if self.all_valid else new[self.valid])
            if self.view_block is not None:
                allk = flat[self.view_block * st.block_size: self.view_block * st.block_size + self.S][None]
            elif self.tables.size(1) == 1:  # one block per row (the contiguous cache): copy only S slots
                allk = store[:, : self.S][self.tables[:, 0]]
            else:
                allk = store[self.tables].flatten(1, 2)[:, : self.S]  # [B, nblk * bs -> S, nkv, hd]
            out.append(allk.transpose(1, 2))
        return out[0], out[1]
