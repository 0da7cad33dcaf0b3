"""Which replica serves a request: pure functions over what the gateway knows of each replica.

    ReplicaView(id, load, cached)   load = sequences queued + running there (the replica's own report, or
                                    this gateway's requests in flight there, whichever is larger);
                                    cached = block hashes of prompt prefixes the replica holds
    prompt_block_hashes(ids, bs)    the chained hashes of the prompt's full blocks, the same hashes the
                                    engine's prefix cache keys its blocks by (infer/block_manager.py)
    order(policy, views, ...)       the replicas best first:
        least_loaded                by load (ties by id, so the order is stable)
        prefix                      the replica holding the longest leading run of the prompt's blocks,
                                    unless its load exceeds the least loaded one's by more than
                                    `overload`; then (and with no hit anywhere) least loaded
        round_robin                 a rotation by `counter`, blind to load and cache

The order, not one pick: Ray Serve tries the next replica when the first refuses (it is full).
"""
from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from tinystack.infer.block_manager import block_hash

POLICIES = ("prefix", "least_loaded", "round_robin")


@dataclass(frozen=True)
class ReplicaView:
    id: str
    load: int
    cached: Container[int] = field(default_factory=frozenset)


def prompt_block_hashes(prompt_ids: Sequence[int], block_size: int, max_blocks: int = 64) -> list[int]:
    """Hashes of the prompt's first full blocks (at most `max_blocks`), chained like the prefix cache's."""
    hashes: list[int] = []
    prev = None
    for i in range(min(len(prompt_ids) // max(1, block_size), max_blocks)):
        prev = block_hash(prev, list(prompt_ids[i * block_size:(i + 1) * block_size]))
        hashes.append(prev)
    return hashes


def prefix_match(hashes: Sequence[int], cached: Container[int]) -> int:
    """How many leading blocks of the prompt `cached` holds (a chained hash implies its whole prefix)."""
    n = 0
    for h in hashes:
        if h not in cached:
            break
        n += 1
    return n


def least_loaded(views: Sequence[ReplicaView]) -> list[str]:
    return [v.id for v in sorted(views, key=lambda v: (v.load, v.id))]


def prefix_aware(views: Sequence[ReplicaView], hashes: Sequence[int], overload: int) -> list[str]:
    ranked = least_loaded(views)
    if not views or not hashes:
        return ranked
    min_load = min(v.load for v in views)
    best = max(views, key=lambda v: (prefix_match(hashes, v.cached), -v.load))
    if prefix_match(hashes, best.cached) == 0 or best.load > min_load + overload:
        return ranked
    return [best.id] + [r for r in ranked if r != best.id]


def round_robin(views: Sequence[ReplicaView], counter: int) -> list[str]:
    ids = sorted(v.id for v in views)
    if not ids:
        return []
    start = counter % len(ids)
    return ids[start:] + ids[:start]


def order(policy: str, views: Sequence[ReplicaView], *, hashes: Sequence[int] = (), overload: int = 4,
          counter: int = 0) -> list[str]:
    """The replica ids best first under `policy` (one of POLICIES)."""
    if policy == "prefix":
        return prefix_aware(views, hashes, overload)
    if policy == "least_loaded":
        return least_loaded(views)
    if policy == "round_robin":
        return round_robin(views, counter)
    raise ValueError(f"unknown routing policy {policy!r}; expected one of {', '.join(POLICIES)}")
