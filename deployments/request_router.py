"""Ray Serve request routers for the LLMServer deployments (Ray's RequestRouterConfig hook).

`LLMAwareRequestRouter` gathers each replica's load (its published routing stats plus this
router's own in-flight count) and asks the pure policy in serve_app/policies/routing.py for a
replica.
`RoundRobinRequestRouter` exists as the baseline the balance test compares against.
Ray's base class does the rest: FIFO order, retries with backoff, dropping dead replicas.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import Counter, OrderedDict
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from serve_app.policies.routing import ReplicaLoad, ScoreWeights, choose, score

logger = logging.getLogger("ray.serve")
MAX_SESSIONS = 10_000


def replica_load(replica: RunningReplica, num_in_flight: int, now_s: float) -> ReplicaLoad:
    stats: dict[str, Any] = replica.routing_stats or {}
    stamp = stats.get("timestamp_s")
    return ReplicaLoad(
        replica_id=replica.replica_id.unique_id,
        num_in_flight=num_in_flight,
        num_waiting=stats.get("num_waiting"),
        num_running=stats.get("num_running"),
        kv_cache_usage=stats.get("kv_cache_usage"),
        stats_age_s=None if stamp is None else max(0.0, now_s - stamp),
        healthy=stats.get("healthy", True),
    )


def _avoided_replica(pending_request: PendingRequest | None) -> str | None:
    args = getattr(pending_request, "args", None) or ()
    return getattr(args[0], "avoid_replica_id", None) if args else None


class LLMAwareRequestRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        self._weights = ScoreWeights(**kwargs.get("weights", {}))
        self._session_affinity = kwargs.get("session_affinity", True)
        self._rng = random.Random(kwargs.get("seed"))
        self._in_flight: Counter[ReplicaID] = Counter()
        # (replica, internal request id) of each accepted request not yet completed. Ray also
        # calls on_request_completed for requests the replica rejected (or that failed before
        # acceptance), which were never counted: only these may decrement _in_flight.
        self._routed: Counter[tuple[ReplicaID, str]] = Counter()
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session id -> replica unique id

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        avoid = _avoided_replica(pending_request)
        if avoid is not None:  # a retry: not the replica that refused it, while there is another
            candidate_replicas = [
                r for r in candidate_replicas if r.replica_id.unique_id != avoid
            ] or candidate_replicas
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        now_s = time.time()
        loads = [replica_load(r, self._in_flight[r.replica_id], now_s) for r in candidate_replicas]
        session = self._session_of(pending_request)
        choice = choose(loads, self._rng, self._weights, self._sessions.get(session))
        if choice is None:
            return []
        if logger.isEnabledFor(logging.DEBUG):
            request_id = pending_request.metadata.request_id if pending_request else "-"
            logger.debug(
                "route %s -> %s (%s) candidates %s",
                request_id,
                choice.replica_id,
                choice.reason,
                choice.candidates,
            )
        if session:
            self._sessions[session] = choice.replica_id
            self._sessions.move_to_end(session)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        # The other healthy ones, best first, as fallbacks if the chosen one refuses (queue full).
        scores = {x.replica_id: score(x, self._weights) for x in loads if x.healthy}
        scores.pop(choice.replica_id, None)
        rest = sorted(
            (r for r in candidate_replicas if r.replica_id.unique_id in scores),
            key=lambda r: scores[r.replica_id.unique_id],
        )
        return [[by_id[choice.replica_id]], rest] if rest else [[by_id[choice.replica_id]]]

    def _session_of(self, pending_request: PendingRequest | None) -> str:
        if not self._session_affinity or pending_request is None:
            return ""
        return pending_request.metadata.session_id or ""

    def on_request_routed(self, pending_request, replica_id: ReplicaID, result) -> None:
        request_id = pending_request.metadata.internal_request_id if pending_request else ""
        self._routed[(replica_id, request_id)] += 1
        self._in_flight[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        key = (replica_id, internal_request_id)
        if self._routed[key] <= 0:
            return  # rejected or failed before acceptance: never counted
        self._routed[key] -= 1
        if self._routed[key] <= 0:
            del self._routed[key]
        if self._in_flight[replica_id] > 0:
            self._in_flight[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._in_flight.pop(replica_id, None)
        for key in [k for k in self._routed if k[0] == replica_id]:
            del self._routed[key]


class RoundRobinRequestRouter(FIFOMixin, RequestRouter):
    """Baseline: each replica in turn, whatever its load."""

    def initialize_state(self, **kwargs) -> None:
        self._turn = itertools.count()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        return [[ordered[next(self._turn) % len(ordered)]]]
