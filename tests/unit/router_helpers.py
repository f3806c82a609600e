"""Shared by the request-router unit tests (test_request_router.py, test_request_router_state.py):
stand-ins for Serve's replicas and pending requests with the attributes the adapters read, and
the routers built with object.__new__ and set up through initialize_state, which is what Serve
calls with `request_router_kwargs` (RequestRouter.__init__ wants a deployment id, a handle
source and Serve's metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ray.serve._private.common import DeploymentID

from llmserve.protocol.replica_call import RoutingStats
from llmserve.request_router.request_router import LLMAwareRequestRouter, RoundRobinRequestRouter

DEPLOYMENT_ID = DeploymentID(name="llm-small", app_name="app")


@dataclass(frozen=True)
class FakeReplicaID:
    unique_id: str


@dataclass(eq=False)
class FakeReplica:
    uid: str
    routing_stats: dict[str, Any] | None = field(default=None)

    def __post_init__(self):
        self.replica_id = FakeReplicaID(self.uid)


def replica(uid: str, age_s: float | None = None, **stats) -> FakeReplica:
    """A replica whose routing stats are `RoutingStats(**stats)` stamped `age_s` ago; neither
    given: one that has not reported yet."""
    if age_s is None and not stats:
        return FakeReplica(uid, None)
    stamp = None if age_s is None else time.time() - age_s
    return FakeReplica(uid, RoutingStats(timestamp_s=stamp, **stats).to_stats())


_n = 0


def request(session_id: str = "", request_id: str | None = None) -> SimpleNamespace:
    global _n
    _n += 1
    return SimpleNamespace(
        metadata=SimpleNamespace(
            session_id=session_id,
            request_id=request_id or f"req-{_n}",
            internal_request_id=f"internal-{_n}",
        )
    )


def llm_router(**kwargs) -> LLMAwareRequestRouter:
    router = object.__new__(LLMAwareRequestRouter)
    router._deployment_id = DEPLOYMENT_ID  # as RequestRouter.__init__ would
    router.initialize_state(**{"seed": 0, **kwargs})
    return router


def round_robin() -> RoundRobinRequestRouter:
    router = object.__new__(RoundRobinRequestRouter)
    router._deployment_id = DEPLOYMENT_ID
    router.initialize_state()
    return router


def ids(ranks) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]
