"""The LLM-aware request router's state (llmserve/request_router/request_router.py), without Ray
running: its own in-flight count per replica (routed, completed, rejected, a replica's death) and
the session table (affinity, when a session moves, its bound).

The routers and the stand-ins for replicas and requests: tests/unit/router_helpers.py.
"""

from __future__ import annotations

import time

from llmserve.policies.replica_ledger import Sessions
from llmserve.protocol.replica_call import RoutingStats
from tests.unit.router_helpers import ids, llm_router, replica, request

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
    assert len(router._in_flight) == 0  # nothing tracked either


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
    a.routing_stats = RoutingStats(healthy=False, timestamp_s=time.time()).to_stats()
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
    assert router2._sessions.get("t") == cool.uid


async def test_session_stays_while_loaded_under_the_limit():
    a, b = replica("a"), replica("b")
    router = llm_router()
    await router.choose_replicas([a, b], request("s"))
    sticky = router._sessions.get("s")
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


async def test_session_table_is_bounded_least_recent_out():
    router = llm_router()
    router._sessions = Sessions(max_sessions=3)
    candidates = [replica("a"), replica("b")]
    for s in ("s1", "s2", "s3"):
        await router.choose_replicas(candidates, request(s))
    await router.choose_replicas(candidates, request("s1"))  # s1 is now the most recent
    await router.choose_replicas(candidates, request("s4"))
    assert list(router._sessions) == ["s3", "s1", "s4"]
