"""The adapter-aware replica choice (llmserve/policies/routing.py), as tables: a replica whose
engine holds the request's LoRA adapter wins within the load margin and loses beyond it (the
adapter is then loaded where the load is lower), a hot adapter spreads over the replicas, and a
request for no adapter, or for one every replica holds, is routed as before."""

from __future__ import annotations

import random

import pytest

from llmserve.policies.routing import ReplicaLoad, ScoreWeights, choose

W = ScoreWeights(adapter_weight=4.0, adapter_load_margin=4.0, prefix_weight=8.0)


def loads(**in_flight: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(rid, n) for rid, n in in_flight.items()]


@pytest.mark.parametrize(
    ("in_flight", "holders", "winner", "reason"),
    [
        ({"a": 0, "b": 0}, {"a"}, "a", "adapter"),
        ({"a": 3, "b": 0}, {"a"}, "a", "adapter"),  # 3 - 4 < 0
        ({"a": 5, "b": 0}, {"a"}, "b", "load"),  # beyond the margin: load it elsewhere
        ({"a": 2, "b": 1, "c": 0}, {"b"}, "b", "adapter"),  # among several, not two sampled
        ({"a": 1, "b": 0, "c": 0}, {"a", "b"}, "b", "adapter"),
    ],
)
def test_adapter_choice(in_flight, holders, winner, reason):
    choice = choose(loads(**in_flight), random.Random(0), W, adapter_holders=frozenset(holders))
    assert (choice.replica_id, choice.reason) == (winner, reason)


def test_an_adapter_every_replica_or_none_holds_routes_as_before():
    ls = loads(a=3, b=0, c=1)
    for holders in (None, frozenset(), frozenset({"x"}), frozenset({"a", "b", "c"})):
        got = choose(ls, random.Random(1), W, adapter_holders=holders)
        assert got == choose(ls, random.Random(1), W)
        assert got.reason == "p2c"


def test_an_unhealthy_holder_never_wins():
    ls = [ReplicaLoad("a", 0, healthy=False), ReplicaLoad("b", 2), ReplicaLoad("c", 2)]
    for seed in range(20):
        got = choose(ls, random.Random(seed), W, adapter_holders=frozenset({"a"}))
        assert got.replica_id in ("b", "c")


def test_prefix_and_adapter_credits_add_up():
    # b holds the adapter, c the prompt; a holds neither: never a.
    ls = loads(a=0, b=0, c=0)
    got = choose(ls, random.Random(0), W, None, {"c": 10}, 10, frozenset({"b"}))
    assert (got.replica_id, got.reason) == ("c", "prefix")  # 8 for the prompt beats 4
    got = choose(ls, random.Random(0), W, None, {"b": 5, "c": 10}, 10, frozenset({"b"}))
    assert got.replica_id in ("b", "c")  # 4 + 8*0.5 = 8 ties c's 8: b or c, never a
    both = [choose(ls, random.Random(s), W, None, {"b": 6}, 10, frozenset({"c"})) for s in range(9)]
    assert {c.replica_id for c in both} == {"b"}  # 8*0.6 = 4.8 beats the adapter's 4


def test_a_hot_adapter_spreads_once_its_holder_is_busy():
    """A burst for one adapter held by one of two replicas: the holder takes requests until
    it is a margin busier than the other, then the other loads the adapter and both share."""
    in_flight = {"a": 0, "b": 0}
    holders = {"a"}
    rng = random.Random(0)
    went = []
    for _ in range(20):
        c = choose(loads(**in_flight), rng, W, adapter_holders=frozenset(holders))
        in_flight[c.replica_id] += 1
        holders.add(c.replica_id)  # its engine loads the adapter for this request
        went.append(c.replica_id)
    assert went[:4] == ["a"] * 4  # affinity first: no load while the holder has room
    assert "b" in went[:6]  # then the hot adapter goes to the second replica too
    assert abs(in_flight["a"] - in_flight["b"]) <= 1  # and both share it evenly


def test_weights_zero_turns_the_credit_off():
    off = ScoreWeights(adapter_weight=0.0)
    ls = loads(a=1, b=0)
    got = choose(ls, random.Random(0), off, adapter_holders=frozenset({"a"}))
    assert (got.replica_id, got.reason) == ("b", "load")
