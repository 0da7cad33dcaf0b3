"""Continuous (iteration-level) batching: who runs in the next step, and with how many tokens.

Every step, within `max_num_batched_tokens` and `max_num_seqs`, in priority order (a request's
`priority`, lower first as in vLLM, then arrival; with equal priorities: first come, first served):
  1. running sequences first: a decode feeds 1 token, an unfinished (chunked) prefill
     feeds as much of the rest of its prompt as the budget allows; when the block
     manager has no block for one, the LAST running sequence in that order (the
     lowest priority, the newest) is preempted (blocks freed, back in the queue at its
     place, recomputed later: its prompt and output so far are prefilled again, mostly
     from the prefix cache)
  2. then waiting sequences join in that order, each starting with the prefix-cache
     hits for its prompt and a prefill chunk of what is left of the budget.
Finished sequences leave after the step that finishes them (`finish`), so their
slot and blocks go to waiting ones at the next step. Nothing waits on a batch.
"""
from __future__ import annotations

import bisect
import time

from tinystack.infer.block_manager import BlockManager
from tinystack.infer.sequence import Sequence, SequenceStatus


def priority_key(seq: Sequence) -> tuple[int, float]:
    """The order sequences are served in: priority (lower first), then arrival."""
    return seq.params.priority, seq.metrics.arrival


class WaitQueue(list):
    """Waiting sequences, kept in priority_key order (a preempted one goes back to its place)."""

    def append(self, seq: Sequence) -> None:
        bisect.insort(self, seq, key=priority_key)

    appendleft = append

    def popleft(self) -> Sequence:
        return self.pop(0)


class Scheduler:
    """Queue + running set + block accounting; `schedule` is the batching policy."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} must be >= max_num_seqs={max_num_seqs} "
                             "(every running sequence decodes one token a step)")
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting = WaitQueue()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take a sequence out (finished or aborted) and give back its blocks."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.release(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.release(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _start(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.RUNNING
        if seq.metrics.scheduled is None:
            seq.metrics.scheduled = time.perf_counter()
            seq.num_cached_prompt_tokens = seq.num_computed  # prefix-cache hits at first admission
        self.running.append(seq)

    def schedule(self, flush: bool = False) -> list[tuple[Sequence, int]]:
        budget = self.max_num_batched_tokens
        batch: list[tuple[Sequence, int]] = []
        preempted = False
        for seq in sorted(self.running, key=priority_key):
            if seq not in self.running:  # preempted while making room for one before it
                continue
            n = min(seq.num_tokens - seq.num_computed, budget)
            if n <= 0:
                continue
            while not self.bm.can_grow(seq, n):
                preempted = True
                victim = max(self.running, key=priority_key)
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.bm.grow(seq, n)
            batch.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            if not seq.block_table:
                self.bm.match_prefix(seq)
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self.bm.can_grow(seq, n):
                self.bm.release(seq)  # give back the prefix hits; try again next step
                break
            self.waiting.popleft()
            self.bm.grow(seq, n)
            self._start(seq)
            batch.append((seq, n))
            budget -= n
        return batch
