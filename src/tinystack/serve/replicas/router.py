"""`ReplicaRouter`: Ray Serve's request router for the engine deployment, with our routing policies.

Ray Serve runs it inside the gateway's deployment handle (one per handle, on Serve's own event-loop
thread) and asks it, for each request, which replicas to try in which order. It turns what it knows
into `routing.ReplicaView`s and lets the pure functions in routing.py decide:

    load     the largest of: the replica's own report (queued + running, its routing stats, polled
             by Serve every ROUTING_STATS_PERIOD_S), the ongoing requests Serve last heard from it,
             and this gateway's requests in flight there or on their way to it (exact, never stale)
    cached   the block hashes in the replica's prefix cache (its report) plus those of the prompts
             this router chose it for lately (so a burst sharing a new prefix sticks to one replica
             before that replica has even answered, let alone reported)
    hint     the request's prompt block hashes: the `prefix` keyword the gateway passes to generate

Serve tries the replicas in the order given and moves on when one is full (its max_ongoing_requests).
The gateway reads the replicas this router sees (registry.py) for /health, /metrics and the dashboard.
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from tinystack.serve.replicas.registry import register
from tinystack.serve.replicas.routing import ReplicaView, order

ROUTING_STATS_PERIOD_S = 0.5
SENT_MEMORY = 4096  # block hashes remembered per replica from the prompts routed there


class ReplicaRouter(RequestRouter):
    def initialize_state(self, policy: str = "prefix", overload: int = 4, **_: Any) -> None:
        self.policy, self.overload = policy, overload
        self.counter = 0
        self.in_flight: dict[str, set[str]] = defaultdict(set)  # replica id -> this gateway's request ids
        self.sent: dict[str, OrderedDict[int, None]] = defaultdict(OrderedDict)
        self._cached_sets: dict[str, tuple[Any, frozenset[int]]] = {}  # replica id -> (its report, as a set)
        # requests chosen for a replica that has not accepted them yet: counted as its load at once, or a
        # burst arriving together would all see the same loads and all pick the same replica
        self.choosing: dict[str, int] = defaultdict(int)
        self._chosen: dict[str, str] = {}  # internal request id -> the replica it was counted against
        register(self)

    # ------------------------------------------------------------ what the gateway reads
    def replica_stats(self) -> dict[str, dict[str, Any]]:
        """Replica id -> its last routing stats (load, KV, prefix cache...), for every replica up."""
        return {r.replica_id.unique_id: dict(r.routing_stats or {}) for r in list(self.curr_replicas.values())}

    # ------------------------------------------------------------ routing
    def _view(self, replica: RunningReplica, with_cache: bool) -> ReplicaView:
        rid = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        load = max(int(stats.get("load", 0)), len(self.in_flight.get(rid, ())) + self.choosing.get(rid, 0),
                   int(self._replica_queue_len_cache.get(replica.replica_id) or 0))
        if not with_cache:
            return ReplicaView(rid, load)
        reported = stats.get("cached", ())
        if self._cached_sets.get(rid, (None,))[0] is not reported:  # a new report: build its set once
            self._cached_sets[rid] = (reported, frozenset(reported))
        return ReplicaView(rid, load, _Union(self._cached_sets[rid][1], self.sent.get(rid, {})))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        hashes: list[int] = []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # all full: back off, do not spin
            hashes = list(pending_request.kwargs.get("prefix") or ())
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        with_cache = self.policy == "prefix" and bool(hashes)
        ranked = order(self.policy, [self._view(r, with_cache) for r in candidate_replicas], hashes=hashes,
                       overload=self.overload, counter=self.counter)
        self.counter += 1
        if ranked and pending_request is not None:
            self._settle(pending_request.metadata.internal_request_id)  # a retry: count it once
            self.choosing[ranked[0]] += 1
            self._chosen[pending_request.metadata.internal_request_id] = ranked[0]
        if with_cache and ranked:
            # remembered at once, not when the replica accepts: the next request of a burst sharing this
            # prefix (routed before that answer comes) follows it to the same replica
            self._remember(ranked[0], hashes)
        return [[by_id[rid]] for rid in ranked]

    def _settle(self, request_id: str) -> None:
        rid = self._chosen.pop(request_id, None)
        if rid is not None and self.choosing.get(rid, 0) > 0:
            self.choosing[rid] -= 1

    def _remember(self, rid: str, hashes: list[int]) -> None:
        sent = self.sent[rid]
        for h in hashes:
            sent[h] = None
            sent.move_to_end(h)
        while len(sent) > SENT_MEMORY:
            sent.popitem(last=False)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._settle(pending_request.metadata.internal_request_id)
        self.in_flight[replica_id.unique_id].add(pending_request.metadata.internal_request_id)
        if self.policy == "prefix":  # where it really went (Serve may have passed over a full first choice)
            self._remember(replica_id.unique_id, list(pending_request.kwargs.get("prefix") or ()))

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._settle(internal_request_id)  # never accepted anywhere (cancelled, failed): uncount it too
        self.in_flight[replica_id.unique_id].discard(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for memo in (self.in_flight, self.sent, self._cached_sets, self.choosing):
            memo.pop(replica_id.unique_id, None)


class _Union:
    """Membership in either of two collections, without copying them (checked per request)."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def __contains__(self, item: object) -> bool:
        return item in self.a or item in self.b
