"""KV memory in blocks, and the per-step view through which a packed batch reads and writes it.

Storage: K and V tensors of shape [n_layer, n_kv_head, num_blocks, block_size, head_dim]: per layer and head,
the slots (block * block_size + offset) in a row, so a row's history is [nkv, S, hd] as attention wants it
(a view for consecutive blocks) and a gather over slots is one contiguous index_select.
The contiguous cache is the same storage with block_size = max_seq_len and one block
per sequence (preallocated to the full context); the paged cache uses small blocks
(default 16 tokens) handed out by the BlockManager. The storage is mapped lazily (weight_arena.hugepage_empty);
each (layer, head) slab's first 2 MiB, where the BlockManager puts the first blocks, is faulted in by a
background thread when the storage is made (`KVStorage.prefault`).

A step runs R sequences, row r feeding n_r new tokens at positions p_r..p_r+n_r-1.
The rows are PACKED, not padded: the model sees one row of N = sum(n_r) tokens
(ids [1, N], `positions` [1, N]), so a 400-token prefill chunk next to 63 one-token
decodes costs 463 token-rows in every linear layer, not 64 x 400.
`BatchView.attend(layer, q, k, v)` is the attention over the cache:
  write:  the N new keys/values go to their slots (block_table[pos // bs] * bs + pos % bs)
  decode rows (one new token each, two or more of them): one batched attention for all of them; each
          row's keys 0..S_r-1 are gathered through its block table into a [D, S_max] batch padded
          to the longest context, the padding masked. The slot indices are built once per step
          (tensor ops, no Python loop over sequences) and serve every layer.
  other rows (prefill chunks, or a lone decode): per row, keys 0..p_r+n_r-1 read as a view when
          its blocks are consecutive in storage (always for the contiguous cache), else gathered
          from just that row's blocks; its n_r queries attend causally within the chunk.
Why batch the decodes: a step of R decodes costs 2 layers x R SDPA calls and reads otherwise, and
for a thin model (SmolLM2: 30 layers) that per-call overhead, not the bytes, dominated. The
gather copies each row's keys once per layer (padding included), which the per-row views did not: in an A/B
probe (SmolLM2 q8_0, 16 rows at contexts 40-400) a batched step cost more CPU than per-row views, whose
consecutive blocks are read in place; the fused step (fused_step.py) reads in place too. To re-measure.
"""
from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

from tinystack.infer.weight_arena import HUGE_PAGE, hugepage_empty, populate


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, hugepages: bool) -> torch.Tensor:
    """Zeros; on the CPU in 2 MiB pages, mapped lazily (decode reads the cache every step, like the weights)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return hugepage_empty(nbytes, hugepages).view(dtype).view(shape)


def _prefault_first_pages(*stores: torch.Tensor) -> None:
    for store in stores:
        for slab in store.view(store.shape[0] * store.shape[1], -1):  # one (layer, head) slab a row
            populate(slab, min(HUGE_PAGE, slab.numel() * slab.element_size()))


class KVStorage:
    def __init__(self, n_layer: int, num_blocks: int, block_size: int, n_kv_head: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", hugepages: bool = True):
        shape = (n_layer, n_kv_head, num_blocks, block_size, head_dim)
        self.k, self.v = (_zeros(shape, dtype, torch.device(device), hugepages) for _ in "kv")
        self.block_size = block_size
        # per layer, the store as [n_kv_head, slots, head_dim] (views, made once: a step asks 2 x n_layer times)
        self.k_slots = [self.k[i].view(n_kv_head, -1, head_dim) for i in range(n_layer)]
        self.v_slots = [self.v[i].view(n_kv_head, -1, head_dim) for i in range(n_layer)]
        self._scratch: list[torch.Tensor] = []
        # The storage is mapped, not yet backed: a block's first write faults in one page in each of the
        # 2 n_layer n_kv_head slabs (one per layer and head of K and of V). The first blocks any sequence takes lie
        # in each slab's first page (block_manager.py packs sequences at the low end), so those pages are faulted
        # in now, off the caller's thread: the first requests then do not wait for the OS to find and zero them.
        self.prefault: threading.Thread | None = None
        if self.k.device.type == "cpu":
            self.prefault = threading.Thread(target=_prefault_first_pages, args=(self.k, self.v), daemon=True,
                                             name="kv-prefault")
            self.prefault.start()

    def gather_buffers(self, shape: tuple[int, ...]) -> list[torch.Tensor]:
        """Two reusable tensors of `shape` for the batched decode's K and V gathers, grown as needed and kept:
        a fresh multi-MB tensor per layer would be fresh pages the kernel must fault in and zero, every time."""
        n = math.prod(shape)
        if not self._scratch or self._scratch[0].numel() < n:
            self._scratch = [torch.empty(2 * n, dtype=self.k.dtype, device=self.k.device) for _ in "kv"]
        return [b[:n].view(shape) for b in self._scratch]

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
    `batch_decodes=False` attends every row on its own (the reference the batched path is tested against).
    """

    def __init__(self, storage: KVStorage, block_tables: list[list[int]], starts: list[int], lengths: list[int],
                 device: torch.device, batch_decodes: bool = True):
        bs = storage.block_size
        self.storage = storage
        self.starts, self.lengths = list(starts), list(lengths)
        self.offsets = [0]
        for n in lengths[:-1]:
            self.offsets.append(self.offsets[-1] + n)
        decodes = [r for r, n in enumerate(lengths) if n == 1] if batch_decodes and len(lengths) > 1 else []
        self.decodes = decodes if len(decodes) > 1 else []
        batched = set(self.decodes)
        slots, pos = [], []
        self.reads: list[tuple[int, int] | torch.Tensor | None] = []  # per row: (first slot, S) view, block ids
        for r, (s, n, table) in enumerate(zip(starts, lengths, block_tables)):
            slots.extend(table[p // bs] * bs + p % bs for p in range(s, s + n))
            pos.extend(range(s, s + n))
            S = s + n
            nblk = -(-S // bs)
            if r in batched:
                self.reads.append(None)  # read through the batch's slot table below
            elif all(table[i] == table[0] + i for i in range(nblk)):
                self.reads.append((table[0] * bs, S))
            else:
                self.reads.append(torch.tensor(table[:nblk], dtype=torch.long, device=device))
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)
        self.positions = torch.tensor([pos], dtype=torch.long, device=device)
        self.last_index = torch.tensor([o + n - 1 for o, n in zip(self.offsets, lengths)], dtype=torch.long,
                                       device=device)
        if self.decodes:
            self._plan_decodes(block_tables, device)

    def _plan_decodes(self, block_tables: list[list[int]], device: torch.device) -> None:
        """Slot of every (decode row, key position < S_max) and the mask of the real ones, for all layers."""
        bs, rows = self.storage.block_size, self.decodes
        lens = torch.tensor([self.starts[r] + 1 for r in rows], device=device)
        s_max = int(lens.max())
        nblk = -(-s_max // bs)
        tables = torch.zeros(len(rows), nblk, dtype=torch.long, device=device)  # padding: block 0, masked
        for i, r in enumerate(rows):
            t = block_tables[r][:nblk]
            tables[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        slots = (tables[:, :, None] * bs + torch.arange(bs, device=device)).flatten(1)[:, :s_max]
        self.decode_slots = slots.reshape(-1)  # [D * S_max]
        self.decode_shape = (len(rows), s_max)
        self.decode_valid = torch.arange(s_max, device=device) < lens[:, None]  # [D, S_max]: the real keys
        self.decode_tokens = torch.tensor([self.offsets[r] for r in rows], dtype=torch.long, device=device)
        self.all_decodes = len(rows) == len(self.lengths)
        self._decode_bias: torch.Tensor | None = None

    def _history(self, flat: torch.Tensor, r: int) -> torch.Tensor:
        """Row r's keys (or values) 0..S-1 from one layer's store [nkv, slots, hd] -> [1, nkv, S, hd]."""
        read, S = self.reads[r], self.starts[r] + self.lengths[r]
        if isinstance(read, tuple):
            return flat[None, :, read[0]: read[0] + S]  # a view: nothing copied
        nkv, _, hd = flat.shape
        return flat.view(nkv, -1, self.storage.block_size, hd)[:, read].flatten(1, 2)[None, :, :S]  # its blocks

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, nh, N, hd], k/v [1, nkv, N, hd] of the packed new tokens -> attention output [1, nh, N, hd]."""
        kl, vl = self.storage.k_slots[layer], self.storage.v_slots[layer]
        kl.index_copy_(1, self.slots, k[0])
        vl.index_copy_(1, self.slots, v[0])
        gqa = k.size(1) != q.size(1)
        if len(self.lengths) == 1:
            return self._attend_row(0, q, kl, vl, gqa)
        if self.decodes and self.all_decodes:  # the steady state of continuous batching: one call
            return self._attend_decodes(q[0].transpose(0, 1)[:, :, None], kl, vl, gqa)[:, :, 0].transpose(0, 1)[None]
        out = torch.empty_like(q)
        if self.decodes:
            qd = q[0].index_select(1, self.decode_tokens).transpose(0, 1)[:, :, None]  # [D, nh, 1, hd]
            out[0].index_copy_(1, self.decode_tokens, self._attend_decodes(qd, kl, vl, gqa)[:, :, 0].transpose(0, 1))
        for r, (o, n) in enumerate(zip(self.offsets, self.lengths)):
            if self.reads[r] is not None:
                out[:, :, o:o + n] = self._attend_row(r, q[:, :, o:o + n], kl, vl, gqa)
        return out

    def _attend_decodes(self, q: torch.Tensor, kl: torch.Tensor, vl: torch.Tensor, gqa: bool) -> torch.Tensor:
        """q [D, nh, 1, hd] of the decode rows -> [D, nh, 1, hd]: softmax(q K^T / sqrt(hd) + mask) V over their
        padded histories as two batched matmuls, batch = (kv head, row), each kv head serving its group of
        query heads in place (no repeated K/V; SDPA's CPU kernel ran slower on one-query rows)."""
        D, nh, _, hd = q.shape
        nkv = kl.size(0)
        S = self.decode_shape[1]

        kbuf, vbuf = self.storage.gather_buffers((nkv, D * S, hd))

        def gather(flat: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:  # [nkv, slots, hd] -> [nkv * D, S, hd]
            return torch.index_select(flat, 1, self.decode_slots, out=buf).view(nkv * D, S, hd)

        qg = q.view(D, nkv, nh // nkv, hd).transpose(0, 1).reshape(nkv * D, nh // nkv, hd)
        if self._decode_bias is None:  # 0 on each row's real keys, -inf on the padding; once per step
            self._decode_bias = torch.zeros(self.decode_shape, dtype=q.dtype, device=q.device).masked_fill_(
                ~self.decode_valid, float("-inf"))[:, None].repeat(nkv, 1, 1)  # [nkv * D, 1, S_max]
        scores = torch.baddbmm(self._decode_bias, qg, gather(kl, kbuf).transpose(1, 2), alpha=hd ** -0.5)
        probs = scores.softmax(-1, dtype=torch.float32)  # in float32 for a bfloat16 cache too, as SDPA does
        out = torch.bmm(probs if probs.dtype == q.dtype else probs.to(q.dtype), gather(vl, vbuf))  # [nkv * D, g, hd]
        return out.view(nkv, D, nh // nkv, hd).transpose(0, 1).reshape(D, nh, 1, hd)

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
