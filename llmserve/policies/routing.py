"""Replica choice for one LLM request: power of two choices on LLM-aware load. Pure.

Ray Serve's default router compares counts of ongoing requests. An LLM replica's real load is
its engine's backlog and KV cache, which differ wildly between a 10-token and a 4,000-token
request, so the score here adds the engine's waiting requests and KV usage (published by each
replica through `record_routing_stats`, refreshed every second or so) to this router's own live
count of requests it sent there (exact and immediate, so a burst does not herd onto one replica
between stats refreshes). Stats older than `stale_after_s` are ignored: only the live count is
trusted then.

With prefix-aware routing on, a replica that holds the start of the request's prompt in its KV
cache (llmserve/policies/prefix_cache.py) scores lower by `prefix_weight` times the share of the
prompt's blocks it holds, so a conversation's next turn goes where its history is cached. The
credit is bounded by load: a replica whose score is more than `prefix_load_margin` above the
least loaded one gets none, so a hot prefix spreads instead of piling onto one queue.

A request for a LoRA adapter weighs the same way which replicas' engines hold the adapter (from
their stats): a holder scores lower by `adapter_weight`, within `adapter_load_margin` of the least
loaded replica. Past that margin the request goes by load and its engine loads the adapter on
demand, so a hot adapter spreads over more replicas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt

from llmserve.policies.params import Params


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    num_in_flight: int  # requests this router sent there that have not completed
    num_waiting: int | None = None  # engine backlog, from the replica's last stats
    num_running: int | None = None
    kv_cache_usage: float | None = None  # 0..1
    stats_age_s: float | None = None  # None: no stats yet
    healthy: bool = True


Weight = Annotated[float, Ge(0)]


@dataclass(frozen=True, kw_only=True)
class ScoreWeights(Params):
    """The score's parameters, and the `routing:` config block's (which adds the router's
    choice and options, llmserve/config/app_config.py): each field's default and bound is written
    here."""

    waiting_weight: Weight = 1.0  # each request queued inside the engine
    kv_cache_weight: Weight = 8.0  # a full KV cache counts as 8 more requests
    in_flight_weight: Weight = 1.0  # each request this router sent there, not yet completed
    # Stats older than this are ignored: only the live in-flight count is trusted then.
    stale_after_s: Annotated[float, Gt(0)] = 5.0
    # Session affinity yields to P2C once the sticky replica's score exceeds this.
    max_affinity_score: Weight = 32.0
    # A prompt fully cached on a replica is worth this many queued requests there.
    prefix_weight: Weight = 8.0
    # No cache credit for a replica scoring more than this above the least loaded one.
    prefix_load_margin: Weight = 8.0
    # An engine holding the request's LoRA adapter (no load from disk, no eviction) is worth
    # this many queued requests there...
    adapter_weight: Weight = 4.0
    # ...unless it scores more than this above the least loaded replica: then the adapter is
    # loaded where the load is lower.
    adapter_load_margin: Weight = 4.0


@dataclass(frozen=True)
class Choice:
    replica_id: str
    # (replica_id, score) of the candidates compared, for the debug log and x-replica header.
    candidates: tuple[tuple[str, float], ...]
    # "only", "affinity", "p2c"; with prefix or adapter data: "prefix", "adapter" or "load"
    reason: str
    # (replica_id, cached blocks of the prompt) of the winner and the runner-up, with prefix data.
    cached_blocks: tuple[tuple[str, int], ...] = ()


def score(load: ReplicaLoad, w: ScoreWeights) -> float:
    s = w.in_flight_weight * load.num_in_flight
    fresh = load.stats_age_s is not None and load.stats_age_s <= w.stale_after_s
    if fresh:
        s += w.waiting_weight * (load.num_waiting or 0)
        s += w.kv_cache_weight * (load.kv_cache_usage or 0.0)
    return s


def choose(
    loads: list[ReplicaLoad],
    rng: random.Random,
    weights: ScoreWeights = ScoreWeights(),
    affinity_replica_id: str | None = None,
    cached_blocks: dict[str, int] | None = None,
    num_prompt_blocks: int = 0,
    adapter_holders: frozenset[str] | None = None,
) -> Choice | None:
    """The replica for one request, or None when no replica is healthy.

    `cached_blocks`: per replica id, how many of the prompt's `num_prompt_blocks` full blocks it
    holds from the start; None or all zero routes by load alone. `adapter_holders`: for a
    request naming a LoRA adapter, the replicas whose engines hold it (None: no adapter)."""
    healthy = [r for r in loads if r.healthy]
    if not healthy:
        return None
    if len(healthy) > 1:
        ids = {r.replica_id for r in healthy}
        blocks = cached_blocks if cached_blocks and num_prompt_blocks > 0 else {}
        if not any(blocks.get(i, 0) for i in ids):
            blocks = {}
        # An adapter held by every healthy replica, or by none, tells them apart no more.
        holders = (adapter_holders or frozenset()) & ids
        if blocks or (holders and holders != ids):
            cache = Cache(blocks, num_prompt_blocks if blocks else 0, frozenset(holders))
            return _by_cache(healthy, rng, weights, affinity_replica_id, cache)
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


@dataclass(frozen=True)
class Cache:
    """What the replicas hold of one request: its prompt's blocks, its adapter."""

    cached_blocks: dict[str, int]  # replica id -> the prompt's leading blocks it holds
    num_prompt_blocks: int
    adapter_holders: frozenset[str]  # replicas whose engines hold the request's adapter


def _by_cache(
    healthy: list[ReplicaLoad],
    rng: random.Random,
    w: ScoreWeights,
    affinity_replica_id: str | None,
    cache: Cache,
) -> Choice:
    # Every candidate, not two at random: the stats are local, and the one holding the prefix
    # or the adapter must be among those compared.
    loads = {r.replica_id: score(r, w) for r in healthy}
    least = min(loads.values())

    def prefix_credit(rid: str) -> float:
        if not cache.num_prompt_blocks or loads[rid] > least + w.prefix_load_margin:
            return 0.0
        return w.prefix_weight * cache.cached_blocks.get(rid, 0) / cache.num_prompt_blocks

    def adapter_credit(rid: str) -> float:
        held = rid in cache.adapter_holders and loads[rid] <= least + w.adapter_load_margin
        return w.adapter_weight if held else 0.0

    ranked = sorted(
        loads,
        # Ties: the session's replica, then a coin (rng), so equal replicas share the load.
        key=lambda rid: (
            loads[rid] - prefix_credit(rid) - adapter_credit(rid),
            rid != affinity_replica_id,
            rng.random(),
        ),
    )
    winner, runner_up = ranked[0], ranked[1]
    if prefix_credit(winner) > 0:
        reason = "prefix"
    elif adapter_credit(winner) > 0:
        reason = "adapter"
    else:
        reason = "load"
    blocks = cache.cached_blocks
    return Choice(
        winner,
        ((winner, loads[winner]), (runner_up, loads[runner_up])),
        reason,
        ((winner, blocks.get(winner, 0)), (runner_up, blocks.get(runner_up, 0))) if blocks else (),
    )
