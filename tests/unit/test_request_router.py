"""The Ray Serve request-router adapters (llmserve/request_router/request_router.py), without Ray
running: a replica's load, the ranks the LLM-aware router hands Serve, its log line, round-robin,
retries.

The routers and the small stand-ins for replicas and pending requests: tests/unit/router_helpers.py.
The in-flight accounting and the session table: test_request_router_state.py.
"""

from __future__ import annotations

import logging
import random
import time

import pytest

import llmserve.request_router.request_router as rr
from llmserve.policies.routing import ReplicaLoad, ScoreWeights, choose
from llmserve.protocol.replica_call import ReplicaRequest, RoutingStats
from llmserve.request_router.request_router import LLMAwareRequestRouter, replica_load
from tests.unit.router_helpers import (
    FakeReplica,
    ids,
    llm_router,
    replica,
    request,
    round_robin,
)

# -- replica_load -----------------------------------------------------------------------

NOW = 1_000_000.0


@pytest.mark.parametrize(
    "case, stats, in_flight, expected",
    [
        ("no stats yet (None)", None, 2, ReplicaLoad("r", 2)),
        ("no stats yet ({})", {}, 0, ReplicaLoad("r", 0)),
        (
            "full stats",
            RoutingStats(
                num_running=3,
                num_waiting=4,
                kv_cache_usage=0.5,
                healthy=True,
                timestamp_s=NOW - 2.5,
            ),
            1,
            ReplicaLoad("r", 1, num_waiting=4, num_running=3, kv_cache_usage=0.5, stats_age_s=2.5),
        ),
        (
            "unhealthy",
            RoutingStats(healthy=False, timestamp_s=NOW),
            0,
            ReplicaLoad("r", 0, stats_age_s=0.0, healthy=False),
        ),
        (
            "stamp from a clock ahead of ours",
            RoutingStats(num_waiting=1, timestamp_s=NOW + 3),
            0,
            ReplicaLoad("r", 0, num_waiting=1, stats_age_s=0.0),
        ),
        (
            "stats without a stamp have no age",
            RoutingStats(num_waiting=7),
            0,
            ReplicaLoad("r", 0, num_waiting=7, stats_age_s=None),
        ),
        (
            "old stamp",
            RoutingStats(num_waiting=7, timestamp_s=NOW - 600),
            5,
            ReplicaLoad("r", 5, num_waiting=7, stats_age_s=600.0),
        ),
    ],
)
def test_replica_load(case, stats, in_flight, expected):
    """Partial dicts from older replicas: tests/unit/test_replica_stats.py."""
    if isinstance(stats, RoutingStats):
        stats = stats.to_stats()
    assert replica_load(FakeReplica("r", stats), in_flight, NOW) == expected, case


# -- initialize_state -------------------------------------------------------------------


def test_initialize_state_takes_the_kwargs_app_py_passes():
    from llmserve.app import request_router_config
    from llmserve.config.app_config import ModelConfig

    routing = {
        "session_affinity": False,
        "waiting_weight": 2.0,
        "kv_cache_weight": 4.0,
        "max_affinity_score": 10.0,
        "stale_after_s": 2.0,
    }
    model = ModelConfig(name="m", source="simulated", routing=routing)
    # Through Ray's own RequestRouterConfig: its kwargs must survive its JSON check.
    router = llm_router(**request_router_config(model).request_router_kwargs)
    assert router._weights == ScoreWeights(
        waiting_weight=2.0, kv_cache_weight=4.0, max_affinity_score=10.0, stale_after_s=2.0
    )
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
    retry.args = [ReplicaRequest("r", "/v1/completions", b"{}", avoid_replica_id="dying")]
    router = llm_router()
    for _ in range(20):
        assert ids(await router.choose_replicas([idle_but_dying, busy], retry)) == [["busy"]]
    # With no other replica, the request still goes somewhere rather than nowhere.
    assert ids(await router.choose_replicas([idle_but_dying], retry)) == [["dying"]]
