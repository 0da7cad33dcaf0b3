"""BPE training: learn merges from pre-token counts with incremental pair counts.

Contract: `learn_merges(word_counts, num_merges)` starts from the 256 single-byte
tokens (id == byte value) and returns up to `num_merges` pairs (a, b); the i-th
pair creates token id 256 + i whose bytes are bytes(a) + bytes(b). Fewer are
returned only when no mergeable pair is left in the corpus.

The rule, which `tests/tokenizer/test_tok_train.py` re-implements naively:
  1. count every adjacent pair over all words, weighted by word frequency;
  2. merge the most frequent pair; ties go to the smallest (a, b) ids;
  3. a pair whose merged bytes already exist as a token is never merged (each
     byte string has exactly one id, which a tiktoken-style rank table and the
     HF vocab both require);
  4. apply the merge left to right, non-overlapping, in every word; repeat.

The trick that makes it fast: the naive loop recounts every pair of every word
per merge (O(merges x corpus)). Here a merge only touches the words that
contain the merged pair (found through an index pair -> word ids) and we apply
the net change in their pair counts. The best pair comes from a max-heap with
lazy deletion: count changes push a fresh entry, stale entries are dropped when
popped (their count no longer matches).
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Callable, Mapping

Pair = tuple[int, int]


def merge_word(word: list[int], a: int, b: int, new_id: int) -> list[int]:
    """Replace every (a, b) in `word`, scanning left to right, non-overlapping."""
    out: list[int] = []
    i, n = 0, len(word)
    while i < n:
        if i < n - 1 and word[i] == a and word[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def learn_merges(
    word_counts: Mapping[bytes, int],
    num_merges: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[Pair]:
    """Learn up to `num_merges` merges from {pre-token bytes: frequency}. Deterministic."""
    words: list[list[int]] = [list(w) for w in word_counts if len(w) > 1]
    freqs: list[int] = [f for w, f in word_counts.items() if len(w) > 1]
    vocab: list[bytes] = [bytes([i]) for i in range(256)]
    known: set[bytes] = set(vocab)

    counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)  # pair -> words that (may) contain it
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for p in zip(w, w[1:]):
            counts[p] += f
            where[p].add(wi)
    # Max-heap via negated counts; equal counts pop the smallest (a, b) first.
    heap = [(-c, a, b) for (a, b), c in counts.items()]
    heapq.heapify(heap)

    merges: list[Pair] = []
    while len(merges) < num_merges and heap:
        neg, a, b = heapq.heappop(heap)
        pair = (a, b)
        if counts.get(pair, 0) != -neg:
            continue  # stale entry: the count changed after this was pushed
        merged = vocab[a] + vocab[b]
        if merged in known:
            counts.pop(pair)  # rule 3: never merged; forget it so it is never pushed again
            continue
        new_id = len(vocab)
        vocab.append(merged)
        known.add(merged)
        merges.append(pair)

        delta: dict[Pair, int] = defaultdict(int)
        # `where` is never pruned (cheaper): a listed word may no longer hold the pair.
        for wi in where.pop(pair):
            w = words[wi]
            if a not in w:
                continue
            new = merge_word(w, a, b, new_id)
            if len(new) == len(w):
                continue
            f = freqs[wi]
            for p in zip(w, w[1:]):
                delta[p] -= f
            for p in zip(new, new[1:]):
                delta[p] += f
                if new_id in p:  # only pairs touching the new token are new to this word
                    where[p].add(wi)
            words[wi] = new
        for p, d in delta.items():
            if d == 0 or (d > 0 and p not in counts and vocab[p[0]] + vocab[p[1]] in known):
                continue  # unchanged, or a new pair that rule 3 would reject anyway
            c = counts.get(p, 0) + d
            if c > 0:
                counts[p] = c
                heapq.heappush(heap, (-c, p[0], p[1]))
            else:
                counts.pop(p, None)
        if progress is not None and len(merges) % 64 == 0:
            progress(len(merges), num_merges)
    if progress is not None and len(merges) % 64:
        progress(len(merges), num_merges)  # always report the final state once
    return merges
