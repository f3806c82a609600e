"""The prefix-aware replica choice (llmserve/policies/routing.py), as tables: the cached prefix
wins within the load margin, loses beyond it, ties go to the session's replica, and without
cache data the choice is today's."""

from __future__ import annotations

import random

import pytest

from llmserve.policies.routing import ReplicaLoad, ScoreWeights, choose

W = ScoreWeights(prefix_weight=8.0, prefix_load_margin=4.0)


def loads(**in_flight: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(rid, n) for rid, n in in_flight.items()]


@pytest.mark.parametrize(
    ("in_flight", "cached", "affinity", "winner", "reason"),
    [
        # The replica holding the prompt wins while within the margin of the least loaded.
        ({"a": 3, "b": 0}, {"a": 10, "b": 0}, None, "a", "prefix"),
        ({"a": 4, "b": 0}, {"a": 10, "b": 0}, None, "a", "prefix"),
        # More than the margin above: no credit; load decides.
        ({"a": 5, "b": 0}, {"a": 10, "b": 0}, None, "b", "load"),
        # Partial prefixes: credit in proportion (a: 2 - 8*0.2 = 0.4; b: 1 - 8*0.9 = -6.2).
        ({"a": 2, "b": 1}, {"a": 2, "b": 9}, None, "b", "prefix"),
        # A short shared prefix is worth less than two requests of queue.
        ({"a": 3, "b": 0}, {"a": 2, "b": 0}, None, "b", "load"),
        # Equal caches: the less loaded; equal everything: the session's replica.
        ({"a": 2, "b": 1}, {"a": 10, "b": 10}, None, "b", "prefix"),
        ({"a": 1, "b": 1}, {"a": 10, "b": 10}, "a", "a", "prefix"),
        ({"a": 1, "b": 1}, {"a": 10, "b": 10}, "b", "b", "prefix"),
        # The hit may be on any of several replicas, not only two sampled ones.
        ({"a": 0, "b": 0, "c": 0, "d": 1}, {"d": 10}, None, "d", "prefix"),
    ],
)
def test_prefix_choice(in_flight, cached, affinity, winner, reason):
    choice = choose(loads(**in_flight), random.Random(0), W, affinity, cached, 10)
    assert (choice.replica_id, choice.reason) == (winner, reason)
    assert dict(choice.cached_blocks)[winner] == cached.get(winner, 0)
    assert len(choice.candidates) == 2 and choice.candidates[0][0] == winner


def test_no_cache_data_routes_as_before():
    ls = loads(a=3, b=0, c=1)
    for cached in (None, {}, {"a": 0, "b": 0}):
        with_prefix = choose(ls, random.Random(1), W, None, cached, 10)
        assert with_prefix == choose(ls, random.Random(1), W)
        assert with_prefix.reason == "p2c"


def test_unhealthy_replica_never_wins_on_cache():
    ls = [ReplicaLoad("a", 0, healthy=False), ReplicaLoad("b", 5)]
    choice = choose(ls, random.Random(0), W, None, {"a": 10}, 10)
    assert choice.replica_id == "b"


def test_hot_prefix_spreads_once_the_holder_is_loaded():
    """Every request shares one prompt that replica a holds: a takes requests while within the
    margin, then b, which then holds it too; from there the two share the load."""
    rng = random.Random(0)
    in_flight = {"a": 0, "b": 0}
    cached = {"a": 10, "b": 0}
    for _ in range(40):
        choice = choose(loads(**in_flight), rng, W, None, cached, 10)
        in_flight[choice.replica_id] += 1
        cached[choice.replica_id] = 10
    assert abs(in_flight["a"] - in_flight["b"]) <= W.prefix_load_margin + 1


def test_equal_replicas_share_ties():
    rng = random.Random(0)
    wins = {"a": 0, "b": 0}
    for _ in range(200):
        wins[choose(loads(a=0, b=0), rng, W, None, {"a": 5, "b": 5}, 10).replica_id] += 1
    assert min(wins.values()) > 60
