"""The Ray Serve request-router adapters (deployments/request_router.py), without Ray running.

RequestRouter.__init__ wants a deployment id, a handle source and Serve's metrics, so the routers
are built with object.__new__ and set up through initialize_state, which is what Serve calls with
`request_router_kwargs`. Replicas and pending requests are small stand-ins with the attributes
the adapters read.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray")
import deployments.request_router as rr  # noqa: E402
from deployments.request_router import (  # noqa: E402
    LLMAwareRequestRouter,
    RoundRobinRequestRouter,
    replica_load,
)
from serve_app.policies.routing import ReplicaLoad, ScoreWeights, choose  # noqa: E402


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
    if age_s is not None:
        stats["timestamp_s"] = time.time() - age_s
    return FakeReplica(uid, stats or None)


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
    router.initialize_state(**{"seed": 0, **kwargs})
    return router


def round_robin() -> RoundRobinRequestRouter:
    router = object.__new__(RoundRobinRequestRouter)
    router.initialize_state()
    return router


def ids(ranks) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


# -- replica_load -----------------------------------------------------------------------

NOW = 1_000_000.0


@pytest.mark.parametrize(
    "case, stats, in_flight, expected",
    [
        ("no stats yet (None)", None, 2, ReplicaLoad("r", 2)),
        ("no stats yet ({})", {}, 0, ReplicaLoad("r", 0)),
        (
            "full stats",
            {
                "num_running": 3,
                "num_waiting": 4,
                "kv_cache_usage": 0.5,
                "healthy": True,
                "timestamp_s": NOW - 2.5,
            },
            1,
            ReplicaLoad("r", 1, num_waiting=4, num_running=3, kv_cache_usage=0.5, stats_age_s=2.5),
        ),
        (
            "unhealthy",
            {"healthy": False, "timestamp_s": NOW},
            0,
            ReplicaLoad("r", 0, stats_age_s=0.0, healthy=False),
        ),
        (
            "stamp from a clock ahead of ours",
            {"num_waiting": 1, "timestamp_s": NOW + 3},
            0,
            ReplicaLoad("r", 0, num_waiting=1, stats_age_s=0.0),
        ),
        (
            "stats without a stamp have no age",
            {"num_waiting": 7},
            0,
            ReplicaLoad("r", 0, num_waiting=7, stats_age_s=None),
        ),
        (
            "old stamp",
            {"num_waiting": 7, "timestamp_s": NOW - 600},
            5,
            ReplicaLoad("r", 5, num_waiting=7, stats_age_s=600.0),
        ),
    ],
)
def test_replica_load(case, stats, in_flight, expected):
    assert replica_load(FakeReplica("r", stats), in_flight, NOW) == expected, case


# -- initialize_state -------------------------------------------------------------------


def test_initialize_state_takes_the_kwargs_app_py_passes():
    router = llm_router(
        session_affinity=False,
        weights={"waiting": 2.0, "kv_cache": 4.0, "max_affinity_score": 10.0},
    )
    assert router._weights == ScoreWeights(waiting=2.0, kv_cache=4.0, max_affinity_score=10.0)
    assert router._session_affinity is False
    defaults = object.__new__(LLMAwareRequestRouter)
    defaults.initialize_state()
    assert defaults._weights == ScoreWeights() and defaults._session_affinity is True


# -- choose_replicas --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
async def test_first_rank_is_the_policy_choice(seed):
    candidates = [
        replica("a", 0.1, num_waiting=3, kv_cache_usage=0.2),
        replica("b", 0.1, num_waiting=0, kv_cache_usage=0.9),
        replica("c", None),
        replica("d", 0.1, num_waiting=1),
    ]
    router = llm_router(seed=seed)
    ranks = await router.choose_replicas(candidates, request())
    loads = [replica_load(r, 0, time.time()) for r in candidates]
    expected = choose(loads, random.Random(seed), ScoreWeights())
    assert ids(ranks)[0] == [expected.replica_id]


async def test_fallback_rank_holds_the_other_healthy_replicas_best_first():
    candidates = [
        replica("busy", 0.1, num_waiting=9),
        replica("idle", None),
        replica("sick", 0.1, healthy=False),
        replica("mid", 0.1, num_waiting=4),
    ]
    router = llm_router()
    for _ in range(20):
        ranks = ids(await router.choose_replicas(candidates, request()))
        first, rest = ranks[0][0], ranks[1]
        assert first != "sick" and "sick" not in rest
        assert sorted([first, *rest]) == ["busy", "idle", "mid"]
        order = {"idle": 0, "mid": 4, "busy": 9}
        assert rest == sorted(rest, key=order.get)


async def test_fallback_order_uses_the_in_flight_count():
    a, b, c = replica("a"), replica("b"), replica("c")
    router = llm_router()
    for _ in range(3):
        router.on_request_routed(request(), b.replica_id, None)
    router.on_request_routed(request(), c.replica_id, None)
    for _ in range(20):
        ranks = ids(await router.choose_replicas([a, b, c], request()))
        assert ranks[0] != ["b"]  # b is the most loaded: it loses whatever it is paired with
        full = ranks[0] + ranks[1]
        assert full.index("b") == 2


async def test_single_replica_has_one_rank():
    router = llm_router()
    assert ids(await router.choose_replicas([replica("a")], request())) == [["a"]]
    assert ids(
        await router.choose_replicas([replica("a"), replica("x", 0.1, healthy=False)], request())
    ) == [["a"]]


@pytest.mark.parametrize(
    "candidates",
    [
        [],
        [replica("a", 0.1, healthy=False)],
        [replica("a", 0.1, healthy=False), replica("b", 60, healthy=False)],
    ],
)
async def test_no_healthy_replica_gives_no_ranks(candidates):
    assert await llm_router().choose_replicas(candidates, request()) == []


async def test_works_without_a_pending_request():
    ranks = await llm_router().choose_replicas([replica("a"), replica("b")], None)
    assert len(ranks) == 2 and len(ranks[0]) == 1


async def test_unhealthy_replica_is_never_first():
    candidates = [
        replica("sick", 0.1, healthy=False),
        replica("ok1", 0.1, num_waiting=50),
        replica("ok2", 0.1, num_waiting=50, kv_cache_usage=1.0),
    ]
    router = llm_router()
    for _ in range(50):
        assert ids(await router.choose_replicas(candidates, request()))[0][0] != "sick"


async def test_decision_is_logged_at_debug_with_request_id_and_candidates():
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler, old_level = Collect(level=logging.DEBUG), rr.logger.level
    rr.logger.addHandler(handler)
    rr.logger.setLevel(logging.DEBUG)
    try:
        await llm_router().choose_replicas(
            [replica("a"), replica("b", 0.1, num_waiting=2)], request(request_id="req-xyz")
        )
    finally:
        rr.logger.removeHandler(handler)
        rr.logger.setLevel(old_level)
    [message] = [r.getMessage() for r in records]
    assert "req-xyz" in message and "-> a" in message and "p2c" in message
    assert "('a', 0.0)" in message and "('b', 2.0)" in message


# -- in-flight accounting ---------------------------------------------------------------


async def test_routed_and_completed_move_the_in_flight_count():
    a, b = replica("a"), replica("b")
    router = llm_router()
    reqs = [request() for _ in range(3)]
    for r in reqs:
        router.on_request_routed(r, a.replica_id, None)
    assert router._in_flight[a.replica_id] == 3
    # With no stats, the in-flight count decides: b wins every time.
    for _ in range(20):
        assert ids(await router.choose_replicas([a, b], request()))[0] == ["b"]
    for r in reqs:
        router.on_request_completed(a.replica_id, r.metadata.internal_request_id)
    assert router._in_flight[a.replica_id] == 0
    firsts = {ids(await router.choose_replicas([a, b], request()))[0][0] for _ in range(40)}
    assert firsts == {"a", "b"}  # a tie again


def test_in_flight_never_goes_negative():
    a = replica("a")
    router = llm_router()
    r = request()
    router.on_request_completed(a.replica_id, "never-routed")
    assert router._in_flight[a.replica_id] == 0
    router.on_request_routed(r, a.replica_id, None)
    router.on_request_completed(a.replica_id, r.metadata.internal_request_id)
    router.on_request_completed(a.replica_id, r.metadata.internal_request_id)  # twice
    assert router._in_flight[a.replica_id] == 0
    assert min(router._in_flight.values(), default=0) >= 0


def test_completion_of_a_rejected_request_does_not_uncount_others():
    # Ray calls on_request_completed for requests the replica rejected (queue full), which
    # never got on_request_routed. They must not cancel out requests that are still running.
    a = replica("a")
    router = llm_router()
    running = [request(), request()]
    for r in running:
        router.on_request_routed(r, a.replica_id, None)
    rejected = request()
    router.on_request_completed(a.replica_id, rejected.metadata.internal_request_id)
    assert router._in_flight[a.replica_id] == 2
    # A request id completed on a different replica than it was routed to does not count either.
    router.on_request_completed(replica("b").replica_id, running[0].metadata.internal_request_id)
    assert router._in_flight[a.replica_id] == 2


def test_replica_death_drops_its_counts():
    a, b = replica("a"), replica("b")
    router = llm_router()
    # State the base class keeps (set by RequestRouter.__init__ under Serve).
    router._replicas = {a.replica_id: a, b.replica_id: b}
    router._replicas_list = [a, b]
    router._replica_id_set = {a.replica_id, b.replica_id}
    router._queue_len_gauge_last_update = {}
    ra, rb = request(), request()
    router.on_request_routed(ra, a.replica_id, None)
    router.on_request_routed(rb, b.replica_id, None)
    router.on_replica_actor_died(a.replica_id)
    assert a.replica_id not in router._replicas
    assert router._in_flight[a.replica_id] == 0 and router._in_flight[b.replica_id] == 1
    router.on_request_completed(a.replica_id, ra.metadata.internal_request_id)  # late callback
    assert router._in_flight[a.replica_id] == 0 and router._in_flight[b.replica_id] == 1


async def test_burst_spreads_over_replicas_with_stale_stats():
    # Stale stats claim r0 is idle; the router's own in-flight count keeps a burst even.
    candidates = [replica("r0", 60, num_waiting=0)]
    candidates += [replica(f"r{i}", 60, num_waiting=40, kv_cache_usage=1.0) for i in (1, 2, 3)]
    by_id = {r.uid: r for r in candidates}
    router = llm_router(seed=3)
    for _ in range(100):
        chosen = ids(await router.choose_replicas(candidates, request()))[0][0]
        router.on_request_routed(request(), by_id[chosen].replica_id, None)
    counts = [router._in_flight[r.replica_id] for r in candidates]
    assert sum(counts) == 100 and max(counts) - min(counts) <= 5, counts


# -- session affinity -------------------------------------------------------------------


async def test_same_session_goes_to_the_same_replica():
    candidates = [replica(u) for u in "abcd"]
    router = llm_router()
    firsts = {
        s: ids(await router.choose_replicas(candidates, request(s)))[0][0]
        for s in (f"s{i}" for i in range(20))
    }
    assert len(set(firsts.values())) > 1  # sessions themselves spread over replicas
    for _ in range(5):
        for s, first in firsts.items():
            chosen = ids(await router.choose_replicas(candidates, request(s)))[0][0]
            assert chosen == first


async def test_session_moves_when_its_replica_is_unhealthy_gone_or_overloaded():
    a, b = replica("a"), replica("b")
    router = llm_router()
    for _ in range(3):
        router.on_request_routed(request(), b.replica_id, None)
    assert ids(await router.choose_replicas([a, b], request("s")))[0] == ["a"]
    # a reports unhealthy: the session moves to b, and stays there afterwards.
    a.routing_stats = {"healthy": False, "timestamp_s": time.time()}
    assert ids(await router.choose_replicas([a, b], request("s")))[0] == ["b"]
    a.routing_stats = None
    assert ids(await router.choose_replicas([a, b], request("s")))[0] == ["b"]
    # b is gone from the candidates: fall back to the others.
    c = replica("c")
    assert ids(await router.choose_replicas([a, c], request("s")))[0][0] in {"a", "c"}
    # Overloaded: a sticky replica past max_affinity_score loses the session.
    router2 = llm_router(weights={"max_affinity_score": 4.0})
    [[first]] = ids(await router2.choose_replicas([a, b], request("t")))[:1]
    hot, cool = (a, b) if first == "a" else (b, a)
    for _ in range(4):  # score 4: still sticky
        router2.on_request_routed(request(), hot.replica_id, None)
    assert ids(await router2.choose_replicas([a, b], request("t")))[0] == [hot.uid]
    router2.on_request_routed(request(), hot.replica_id, None)  # score 5: over the limit
    assert ids(await router2.choose_replicas([a, b], request("t")))[0] == [cool.uid]
    assert router2._sessions["t"] == cool.uid


async def test_session_stays_while_loaded_under_the_limit():
    a, b = replica("a"), replica("b")
    router = llm_router()
    await router.choose_replicas([a, b], request("s"))
    sticky = router._sessions["s"]
    stuck = a if sticky == "a" else b
    for _ in range(10):  # 10 more in flight than the other replica, still under 32
        router.on_request_routed(request(), stuck.replica_id, None)
    assert ids(await router.choose_replicas([a, b], request("s")))[0] == [sticky]
    assert ids(await router.choose_replicas([a, b], request("other")))[0] != [sticky]


async def test_session_affinity_can_be_turned_off():
    candidates = [replica(u) for u in "abcd"]
    router = llm_router(session_affinity=False)
    firsts = {ids(await router.choose_replicas(candidates, request("s")))[0][0] for _ in range(40)}
    assert len(firsts) > 1
    assert not router._sessions


async def test_requests_without_a_session_are_not_remembered():
    router = llm_router()
    await router.choose_replicas([replica("a"), replica("b")], request(""))
    assert not router._sessions


async def test_session_table_is_bounded_least_recent_out(monkeypatch):
    monkeypatch.setattr(rr, "MAX_SESSIONS", 3)
    router = llm_router()
    candidates = [replica("a"), replica("b")]
    for s in ("s1", "s2", "s3"):
        await router.choose_replicas(candidates, request(s))
    await router.choose_replicas(candidates, request("s1"))  # s1 is now the most recent
    await router.choose_replicas(candidates, request("s4"))
    assert list(router._sessions) == ["s3", "s1", "s4"]


# -- round robin ------------------------------------------------------------------------


async def test_round_robin_cycles_in_a_stable_order():
    a, b, c = replica("a"), replica("b"), replica("c", 0.1, num_waiting=100)
    router = round_robin()
    orders = [[a, b, c], [c, b, a], [b, a, c]]
    seen = [ids(await router.choose_replicas(orders[i % 3], request()))[0][0] for i in range(9)]
    assert seen == ["a", "b", "c"] * 3  # whatever order Ray lists them in, and whatever load


async def test_round_robin_edge_cases():
    router = round_robin()
    assert await router.choose_replicas([], request()) == []
    only = replica("only")
    assert [ids(await router.choose_replicas([only], request())) for _ in range(3)] == [
        [["only"]]
    ] * 3
    # Replicas added later join the cycle.
    seen = [
        ids(await router.choose_replicas([replica("x"), replica("y")], None))[0][0]
        for _ in range(4)
    ]
    assert sorted(seen) == ["x", "x", "y", "y"]


async def test_a_retry_skips_the_replica_that_refused_it_while_another_exists():
    # The refusing replica (its engine died) holds nothing, so it would win every comparison.
    idle_but_dying, busy = replica("dying"), replica("busy", 0.1, num_waiting=20)
    retry = request()
    retry.args = [SimpleNamespace(avoid_replica_id="dying")]
    router = llm_router()
    for _ in range(20):
        assert ids(await router.choose_replicas([idle_but_dying, busy], retry)) == [["busy"]]
    # With no other replica, the request still goes somewhere rather than nowhere.
    assert ids(await router.choose_replicas([idle_but_dying], retry)) == [["dying"]]
