"""Which KV-cache blocks each sequence owns: a free list, block tables, refcounts, prefix caching.

The cache is `num_blocks` fixed-size blocks of `block_size` token slots. A sequence's
block table lists its blocks in order; token i lives in slot
`block_table[i // block_size] * block_size + i % block_size`.

Prefix caching: when a block fills, it is registered under a hash of its tokens and of
the hash of the block before it (so equal hashes mean an equal whole prefix). A new
sequence whose prompt starts with registered blocks shares them (refcount + 1) and
skips computing those tokens. A block whose refcount drops to 0 keeps its contents and
hash on an LRU list; it is reused by a later hit, or evicted (least recently used first)
when the free list is empty. At least one prompt token is always computed, so a step
has logits to sample from.

Placement: a sequence's blocks are taken consecutively where possible (its next block is
the one after its last, if free), so most rows of a step read their keys as one view of the
storage instead of a gather (paged_cache.py). A new sequence starts at the largest free run;
if a live sequence ends just before that run, the new one starts where that sequence would end
at its maximum length (`max_len`: prompt + max_tokens), or in the middle of the run if that is
nearer, leaving it room to grow. Starting no further out than that keeps live sequences packed
at the low end of the storage: each (layer, head) of the KV storage is its own slab of 2 MiB pages
(paged_cache.py), so a block in a part of the storage no block has used yet makes the OS fault in
and zero a fresh page in every slab (180 for SmolLM2): kernel time the request waits for
(BENCHMARKS.md, "KV pages a fresh engine faults in"). Nothing is reserved: any free block still goes
to whoever needs it when memory is short.

Invariants (tested under random interleavings): every block is exactly one of
used (ref > 0), cached (ref == 0, hashed, on the LRU) or free; after every sequence has
finished or been aborted, nothing is used.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from tinystack.infer.sequence import Sequence


class NoFreeBlocksError(RuntimeError):
    """The scheduler asked for more blocks than `can_grow` allowed."""


def block_hash(prev: int | None, tokens: list[int]) -> int:
    return hash((prev, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = enable_prefix_caching
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        self.free = np.ones(num_blocks, dtype=bool)  # never used, or released without a hash
        self.num_plain_free = num_blocks
        # the last block of each live sequence -> the block after where it ends at its maximum length, were it
        # to grow consecutively (a new sequence starts there, not right after the tail)
        self.tails: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # ref == 0 but hashed: reusable, evictable
        self.prefix_hits = 0  # tokens served from the prefix cache, for reports and metrics
        self.prefix_queries = 0  # tokens looked up in it (hit rate = hits / queries)

    # -- counters (tests, health, the memory report) --
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: never-used ones plus evictable cached ones."""
        return self.num_plain_free + len(self.lru)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.lru)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- allocation --
    def _take(self, prefer: int | None = None) -> int:
        """A free block: `prefer` if it is free, else the start of a new extent, else evict the LRU."""
        if prefer is not None and prefer < self.num_blocks and self.free[prefer]:
            b = prefer
        elif self.num_plain_free:
            b = self._new_extent()
        elif self.lru:
            b, _ = self.lru.popitem(last=False)  # evict the least recently used cached block
            del self.by_hash[self.hash_of[b]]
            self.hash_of[b] = None
            self.ref[b] = 1
            return b
        else:
            raise NoFreeBlocksError("no free KV-cache blocks")
        self.free[b] = False
        self.num_plain_free -= 1
        self.ref[b] = 1
        return b

    def _new_extent(self) -> int:
        """The first block of the largest run of free blocks, or its middle if a live sequence ends just before it."""
        edges = np.flatnonzero(np.diff(np.concatenate(([False], self.free, [False])).astype(np.int8)))
        starts, ends = edges[0::2], edges[1::2]
        i = int(np.argmax(ends - starts))
        a, e = int(starts[i]), int(ends[i])
        reach = self.tails.get(a - 1)
        return a if reach is None else min(reach, a + (e - a) // 2)

    def match_prefix(self, seq: Sequence) -> None:
        """For a sequence with no blocks: share every cached full block its tokens start with."""
        assert not seq.block_table and seq.num_computed == 0
        if not self.prefix_caching:
            return
        self.prefix_queries += seq.num_tokens
        prev = seq.cache_salt  # a LoRA adapter's blocks never match the base's or another adapter's
        for i in range((seq.num_tokens - 1) // self.block_size):  # leave >= 1 token to compute
            h = block_hash(prev, seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            b = self.by_hash.get(h)
            if b is None:
                break
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1
            seq.block_table.append(b)
            seq.block_hashes.append(h)
            prev = h
        seq.num_computed = len(seq.block_table) * self.block_size
        self.prefix_hits += seq.num_computed

    def can_grow(self, seq: Sequence, n: int) -> bool:
        """Are there blocks for `n` more computed tokens of `seq`?"""
        return self.blocks_for(seq.num_computed + n) - len(seq.block_table) <= self.num_free_blocks

    def grow(self, seq: Sequence, n: int) -> None:
        need = self.blocks_for(seq.num_computed + n) - len(seq.block_table)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"{seq.request_id} needs {need} blocks, {self.num_free_blocks} free")
        if not need:
            return
        table = seq.block_table
        if table:
            self.tails.pop(table[-1], None)
        for _ in range(need):
            table.append(self._take(table[-1] + 1 if table else None))
        self._mark_tail(seq)

    def _mark_tail(self, seq: Sequence) -> None:
        table = seq.block_table
        self.tails[table[-1]] = table[-1] + 1 + max(0, self.blocks_for(seq.max_len) - len(table))

    def truncate(self, seq: Sequence) -> None:
        """Free the blocks past the sequence's computed tokens (rejected speculative tokens were written there).

        Those blocks were grown this step for unverified tokens, so they are private and unhashed."""
        keep = max(1, self.blocks_for(seq.num_computed))
        if len(seq.block_table) <= keep:
            return
        self.tails.pop(seq.block_table[-1], None)
        for b in seq.block_table[keep:]:
            assert self.ref[b] == 1 and self.hash_of[b] is None, f"block {b} is shared or cached"
            self.ref[b] = 0
            self.free[b] = True
            self.num_plain_free += 1
        del seq.block_table[keep:]
        self._mark_tail(seq)

    def commit(self, seq: Sequence) -> None:
        """After a step: register the blocks that are now full of computed tokens."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        while len(seq.block_hashes) < seq.num_computed // bs:
            i = len(seq.block_hashes)
            h = block_hash(seq.block_hashes[-1] if i else seq.cache_salt, seq.token_ids[i * bs:(i + 1) * bs])
            seq.block_hashes.append(h)
            b = seq.block_table[i]
            if h not in self.by_hash and self.hash_of[b] is None:  # first copy wins; duplicates stay private
                self.by_hash[h] = b
                self.hash_of[b] = h

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's references; its hashed blocks stay cached, the rest go free."""
        if seq.block_table:
            self.tails.pop(seq.block_table[-1], None)
        for b in reversed(seq.block_table):  # tail first: the LRU evicts a prefix's end before its start
            self.ref[b] -= 1
            assert self.ref[b] >= 0, f"block {b} released twice"
            if self.ref[b] == 0:
                if self.hash_of[b] is not None:
                    self.lru[b] = None
                else:
                    self.free[b] = True
                    self.num_plain_free += 1
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed = 0

    def check(self) -> None:
        """Assert the invariants (tests call this after random operations)."""
        free, lru = set(np.flatnonzero(self.free).tolist()), set(self.lru)
        assert len(free) == self.num_plain_free and not free & lru
        for b in range(self.num_blocks):
            in_use = self.ref[b] > 0
            assert in_use + (b in free) + (b in lru) == 1, (
                f"block {b}: ref={self.ref[b]} free={b in free} lru={b in lru}")
            if b in lru:
                assert self.hash_of[b] is not None and self.by_hash[self.hash_of[b]] == b
