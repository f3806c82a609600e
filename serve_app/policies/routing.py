"""Replica choice for one LLM request: power of two choices on LLM-aware load. Pure.

Ray Serve's default router compares counts of ongoing requests. An LLM replica's real load is
its engine's backlog and KV cache, which differ wildly between a 10-token and a 4,000-token
request, so the score here adds the engine's waiting requests and KV usage (published by each
replica through `record_routing_stats`, refreshed every second or so) to this router's own live
count of requests it sent there (exact and immediate, so a burst does not herd onto one replica
between stats refreshes). Stats older than `stale_after_s` are ignored: only the live count is
trusted then.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    num_in_flight: int  # requests this router sent there that have not completed
    num_waiting: int | None = None  # engine backlog, from the replica's last stats
    num_running: int | None = None
    kv_cache_usage: float | None = None  # 0..1
    stats_age_s: float | None = None  # None: no stats yet
    healthy: bool = True


@dataclass(frozen=True)
class ScoreWeights:
    waiting: float = 1.0  # each request queued inside the engine
    kv_cache: float = 8.0  # a full KV cache counts as 8 more requests
    in_flight: float = 1.0
    stale_after_s: float = 5.0
    # Session affinity yields to P2C once the sticky replica's score exceeds this.
    max_affinity_score: float = 32.0


@dataclass(frozen=True)
class Choice:
    replica_id: str
    # (replica_id, score) of the candidates compared, for the debug log and x-replica header.
    candidates: tuple[tuple[str, float], ...]
    reason: str  # "p2c", "only", "affinity"


def score(load: ReplicaLoad, w: ScoreWeights) -> float:
    s = w.in_flight * load.num_in_flight
    fresh = load.stats_age_s is not None and load.stats_age_s <= w.stale_after_s
    if fresh:
        s += w.waiting * (load.num_waiting or 0) + w.kv_cache * (load.kv_cache_usage or 0.0)
    return s


def choose(
    loads: list[ReplicaLoad],
    rng: random.Random,
    weights: ScoreWeights = ScoreWeights(),
    affinity_replica_id: str | None = None,
) -> Choice | None:
    """The replica for one request, or None when no replica is healthy."""
    healthy = [r for r in loads if r.healthy]
    if not healthy:
        return None
    if affinity_replica_id is not None:
        sticky = next((r for r in healthy if r.replica_id == affinity_replica_id), None)
        if sticky is not None:
            s = score(sticky, weights)
            if s <= weights.max_affinity_score:
                return Choice(sticky.replica_id, ((sticky.replica_id, s),), "affinity")
    if len(healthy) == 1:
        only = healthy[0]
        return Choice(only.replica_id, ((only.replica_id, score(only, weights)),), "only")
    a, b = rng.sample(healthy, 2)
    sa, sb = score(a, weights), score(b, weights)
    if sa == sb:
        winner = a if rng.random() < 0.5 else b
    else:
        winner = a if sa < sb else b
    return Choice(winner.replica_id, ((a.replica_id, sa), (b.replica_id, sb)), "p2c")
