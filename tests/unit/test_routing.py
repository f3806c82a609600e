"""Power of two choices on LLM-aware replica load (llmserve/policies/routing.py): pure, seeded RNG,
no Ray."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from llmserve.policies.routing import Choice, ReplicaLoad, ScoreWeights, choose, score

W = ScoreWeights()  # waiting 1, kv 8, in_flight 1, stale after 5 s, affinity up to 32


def load(
    replica_id: str,
    num_in_flight: int = 0,
    num_waiting: int | None = None,
    kv_cache_usage: float | None = None,
    stats_age_s: float | None = 0.5,
    healthy: bool = True,
    num_running: int | None = None,
) -> ReplicaLoad:
    return ReplicaLoad(
        replica_id=replica_id,
        num_in_flight=num_in_flight,
        num_waiting=num_waiting,
        num_running=num_running,
        kv_cache_usage=kv_cache_usage,
        stats_age_s=stats_age_s,
        healthy=healthy,
    )


def chosen_ids(loads, seeds=range(400), **kwargs) -> Counter:
    return Counter(choose(loads, random.Random(s), **kwargs).replica_id for s in seeds)


# -- score -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, replica, weights, expected",
    [
        ("idle, no stats", load("a", stats_age_s=None), W, 0.0),
        ("in-flight only, no stats yet", load("a", 3, 7, 0.9, stats_age_s=None), W, 3.0),
        (
            "fresh stats add waiting and kv",
            load("a", 2, 4, 0.5, stats_age_s=1.0),
            W,
            2 + 4 + 8 * 0.5,
        ),
        ("age exactly at the limit is fresh", load("a", 2, 4, 0.5, stats_age_s=5.0), W, 10.0),
        ("stale stats ignored", load("a", 2, 4, 0.5, stats_age_s=5.01), W, 2.0),
        ("very stale stats ignored", load("a", 0, 100, 1.0, stats_age_s=3600.0), W, 0.0),
        ("fresh, missing fields count as zero", load("a", 1, None, None, stats_age_s=0.0), W, 1.0),
        (
            "num_running is not in the score (in-flight covers it)",
            load("a", 1, 0, 0.0, num_running=50),
            W,
            1.0,
        ),
        (
            "custom weights",
            load("a", 2, 4, 0.5),
            ScoreWeights(waiting_weight=2.0, kv_cache_weight=10.0, in_flight_weight=0.5),
            1 + 8 + 5,
        ),
        (
            "custom stale_after_s",
            load("a", 2, 4, 0.5, stats_age_s=1.5),
            ScoreWeights(stale_after_s=1.0),
            2.0,
        ),
        (
            "zero weights leave only in-flight",
            load("a", 3, 9, 1.0),
            ScoreWeights(waiting_weight=0.0, kv_cache_weight=0.0),
            3.0,
        ),
    ],
)
def test_score(case, replica, weights, expected):
    assert score(replica, weights) == pytest.approx(expected), case


# -- choose: basic outcomes ------------------------------------------------------------


@pytest.mark.parametrize(
    "case, loads, expected_id, expected_reason",
    [
        ("no replicas", [], None, None),
        ("none healthy", [load("a", healthy=False), load("b", healthy=False)], None, None),
        ("one replica", [load("a", 9, 9, 1.0)], "a", "only"),
        (
            "one healthy of three",
            [load("a", healthy=False), load("b", 40, 40, 1.0), load("c", healthy=False)],
            "b",
            "only",
        ),
        ("two: lower in-flight", [load("a", 3), load("b", 1)], "b", "p2c"),
        ("two: fresh backlog counts", [load("a", 0, 6), load("b", 2, 0)], "b", "p2c"),
        (
            "two: stale backlog ignored",
            [load("a", 0, 6, stats_age_s=60), load("b", 2, 0)],
            "a",
            "p2c",
        ),
        ("two: kv usage counts", [load("a", 1, 0, 0.9), load("b", 2, 0, 0.0)], "b", "p2c"),
    ],
)
def test_choose_outcomes(case, loads, expected_id, expected_reason):
    for seed in range(50):
        c = choose(loads, random.Random(seed), W)
        if expected_id is None:
            assert c is None, case
        else:
            assert (c.replica_id, c.reason) == (expected_id, expected_reason), case


def test_choice_lists_candidates_with_their_scores():
    a, b = load("a", 1, 2, 0.5), load("b", 0)
    c = choose([a, b], random.Random(0), W)
    assert c == Choice("b", c.candidates, "p2c")
    assert dict(c.candidates) == {"a": score(a, W), "b": 0.0}
    only = choose([a], random.Random(0), W)
    assert only.candidates == (("a", score(a, W)),)


@pytest.mark.parametrize("n", [3, 4, 8])
def test_p2c_picks_the_lower_score_of_the_two_sampled(n):
    loads = [
        load(f"r{i}", num_in_flight=i, num_waiting=2 * i, kv_cache_usage=i / n) for i in range(n)
    ]
    sampled = Counter()
    for seed in range(300):
        c = choose(loads, random.Random(seed), W)
        assert c.reason == "p2c"
        assert len(c.candidates) == 2
        (id1, s1), (id2, s2) = c.candidates
        assert id1 != id2
        assert c.replica_id == (id1 if s1 < s2 else id2)
        sampled.update([id1, id2])
    assert set(sampled) == {f"r{i}" for i in range(n)}  # every replica gets sampled
    # The most loaded replica can never win: whatever it is paired with scores lower.
    assert f"r{n - 1}" not in chosen_ids(loads, seeds=range(300), weights=W)


@pytest.mark.parametrize("n_unhealthy", [1, 2, 3])
def test_never_picks_an_unhealthy_replica(n_unhealthy):
    # The unhealthy replicas look idle; the healthy ones are loaded.
    loads = [load(f"sick{i}", healthy=False) for i in range(n_unhealthy)]
    loads += [load("busy1", 20, 10, 0.9), load("busy2", 30, 10, 0.9)]
    picks = chosen_ids(loads, seeds=range(500), weights=W)
    assert set(picks) <= {"busy1", "busy2"}
    assert all(
        cid.startswith("busy")
        for seed in range(100)
        for cid, _ in choose(loads, random.Random(seed), W).candidates
    )


def test_ties_break_at_random_roughly_half_each():
    loads = [load("a", 2, 1, 0.25), load("b", 2, 1, 0.25)]
    picks = chosen_ids(loads, seeds=range(2000), weights=W)
    assert set(picks) == {"a", "b"}
    assert 800 <= picks["a"] <= 1200, picks


def test_ties_among_many_replicas_spread_over_all_of_them():
    loads = [load(f"r{i}", 1) for i in range(4)]
    picks = chosen_ids(loads, seeds=range(2000), weights=W)
    assert set(picks) == {"r0", "r1", "r2", "r3"}
    assert min(picks.values()) >= 350, picks


def test_all_replicas_busy_still_returns_a_choice():
    loads = [load(f"r{i}", 50, 30, 1.0) for i in range(4)]
    for seed in range(50):
        c = choose(loads, random.Random(seed), W)
        assert c is not None and c.reason == "p2c"
        assert c.replica_id in {"r0", "r1", "r2", "r3"}


def test_same_seed_same_choices():
    loads = [load(f"r{i}", i % 3, i % 2, 0.1 * i) for i in range(6)]

    def run(seed):
        rng = random.Random(seed)
        return [choose(loads, rng, W).replica_id for _ in range(50)]

    assert run(42) == run(42)
    assert run(42) != run(43)  # the rng is really used


# -- bursts between stats refreshes -----------------------------------------------------


def burst(loads: list[ReplicaLoad], n: int, seed: int) -> Counter:
    """Routes n requests in a row, none completing; each choice adds one to that replica's
    in-flight count (what the adapter's on_request_routed does), the stats stay as they are."""
    rng, state, sent = random.Random(seed), {r.replica_id: r for r in loads}, Counter()
    for _ in range(n):
        c = choose(list(state.values()), rng, W)
        r = state[c.replica_id]
        state[c.replica_id] = replace(r, num_in_flight=r.num_in_flight + 1)
        sent[c.replica_id] += 1
    return sent


@pytest.mark.parametrize("seed", range(20))
def test_burst_with_stale_stats_spreads_evenly(seed):
    # Stale stats claim r0 is idle and the rest are swamped. Were they trusted, every request
    # of the burst would go to r0; the live in-flight count keeps the spread even instead.
    loads = [load("r0", 0, 0, 0.0, stats_age_s=30.0)]
    loads += [load(f"r{i}", 0, 40, 1.0, stats_age_s=30.0) for i in (1, 2, 3)]
    sent = burst(loads, 100, seed)
    assert sum(sent.values()) == 100
    assert set(sent) == {"r0", "r1", "r2", "r3"}
    assert max(sent.values()) - min(sent.values()) <= 5, sent  # 1000 seeds: 94% within 2


def test_burst_with_fresh_stats_follows_them_then_evens_out():
    # The contrast: fresh stats say r0 has 40 fewer queued requests, so it takes the first
    # ones; the in-flight count catches up with the backlog and the rest then spread.
    loads = [load("r0", 0, 0, 0.0)] + [load(f"r{i}", 0, 40, 0.0) for i in (1, 2, 3)]
    sent = burst(loads, 100, seed=0)
    assert sent["r0"] >= 40
    totals = {r: sent[r] + (0 if r == "r0" else 40) for r in ("r0", "r1", "r2", "r3")}
    assert max(totals.values()) - min(totals.values()) <= 4, sent


# -- what the LLM-aware score is for ----------------------------------------------------


def test_equal_in_flight_but_engine_backlog_and_full_kv_lose():
    # Ray's default router compares only ongoing-request counts, which are equal here.
    # The engine stats show "hot" has 5 requests queued and a 90% full KV cache.
    hot = load("hot", num_in_flight=3, num_waiting=5, kv_cache_usage=0.9)
    cool = load("cool", num_in_flight=3, num_waiting=0, kv_cache_usage=0.1)
    assert score(hot, W) > score(cool, W)
    assert chosen_ids([hot, cool], seeds=range(200), weights=W) == Counter({"cool": 200})
    # With more replicas: whenever both are sampled, "cool" wins.
    others = [load(f"o{i}", 3, 2, 0.5) for i in range(3)]
    both_sampled = 0
    for seed in range(500):
        c = choose([hot, cool, *others], random.Random(seed), W)
        if {cid for cid, _ in c.candidates} == {"hot", "cool"}:
            both_sampled += 1
            assert c.replica_id == "cool"
        assert c.replica_id != "hot"  # every other replica scores lower than hot, too
    assert both_sampled > 0
    # The same two with stale stats are a tie: a count-only router could not tell them apart.
    stale = [replace(hot, stats_age_s=60.0), replace(cool, stats_age_s=60.0)]
    assert set(chosen_ids(stale, seeds=range(200), weights=W)) == {"hot", "cool"}


# -- session affinity -------------------------------------------------------------------

OTHERS = [load("b", 0), load("c", 0)]


@pytest.mark.parametrize(
    "case, sticky, affinity_id, weights, expect_sticky",
    [
        ("sticky and lightly loaded", load("a", 4, 2, 0.5), "a", W, True),
        ("sticky more loaded than others but under the limit", load("a", 20, 4, 1.0), "a", W, True),
        ("score exactly at the limit", load("a", 24, 0, 1.0), "a", W, True),  # 24 + 8 = 32
        ("score just over the limit", load("a", 25, 0, 1.0), "a", W, False),
        ("overloaded", load("a", 40, 30, 1.0), "a", W, False),
        ("unhealthy", load("a", 0, healthy=False), "a", W, False),
        ("stale backlog ignored: stays", load("a", 5, 100, 1.0, stats_age_s=60), "a", W, True),
        ("lower limit", load("a", 4, 2, 0.5), "a", ScoreWeights(max_affinity_score=5.0), False),
        ("no affinity", load("a", 0), None, W, False),
        ("sticky replica gone", load("a", 0), "zz", W, False),
    ],
)
def test_affinity(case, sticky, affinity_id, weights, expect_sticky):
    loads = [sticky, *OTHERS]
    for seed in range(100):
        c = choose(loads, random.Random(seed), weights, affinity_replica_id=affinity_id)
        if expect_sticky:
            assert (c.replica_id, c.reason) == ("a", "affinity"), case
            assert c.candidates == (("a", score(sticky, weights)),)
        else:
            assert c.reason == "p2c", case
            if not sticky.healthy or score(sticky, weights) > weights.max_affinity_score:
                assert c.replica_id != "a", case  # b and c are idle, so never a


def test_affinity_fallback_with_a_single_other_replica_is_only():
    c = choose(
        [load("a", healthy=False), load("b", 3)], random.Random(0), W, affinity_replica_id="a"
    )
    assert (c.replica_id, c.reason) == ("b", "only")


def test_affinity_with_no_healthy_replica_is_none():
    assert choose([load("a", healthy=False)], random.Random(0), W, affinity_replica_id="a") is None


def test_affinity_does_not_consume_the_rng():
    # A sticky pick draws no random numbers, so it does not shift later choices.
    loads = [load("a", 1), *OTHERS]
    rng1, rng2 = random.Random(5), random.Random(5)
    choose(loads, rng1, W, affinity_replica_id="a")
    assert rng1.random() == rng2.random()
