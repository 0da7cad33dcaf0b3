"""The dynamic batcher: the baseline continuous batching is measured against.

Requests queue up; the queue is flushed into a batch when it holds `max_num_seqs`
requests or its oldest has waited `max_wait` seconds (or the caller says no more
are coming: `flush`), whichever comes first. The batch is admitted only as far as
its members fit in the cache at their full length, prefilled whole, and then runs
to completion: members that finish stop computing, but nobody joins until the
whole batch is done. Same engine, model runner and cache; only this policy differs.
"""
from __future__ import annotations

import time

from tinystack.infer.block_manager import BlockManager
from tinystack.infer.scheduler import Scheduler
from tinystack.infer.sequence import Sequence


class DynamicBatcher(Scheduler):
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_wait: float):
        super().__init__(block_manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=10**9)
        self.max_wait = max_wait

    def schedule(self, flush: bool = False) -> list[tuple[Sequence, int]]:
        if not self.running:
            ready = self.waiting and (len(self.waiting) >= self.max_num_seqs or flush
                                      or time.perf_counter() - self.waiting[0].metrics.arrival >= self.max_wait)
            if not ready:
                return []
            reserved = 0
            while self.waiting and len(self.running) < self.max_num_seqs:
                seq = self.waiting[0]
                need = self.bm.blocks_for(seq.max_len)
                if reserved + need > self.bm.num_free_blocks:
                    break
                reserved += need
                self._start(self.waiting.popleft())
        batch = [(seq, seq.num_tokens - seq.num_computed) for seq in self.running]
        for seq, n in batch:
            self.bm.grow(seq, n)
        return batch
