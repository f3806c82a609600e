"""The queue-length autoscaling policy (llmserve/policies/autoscaling.py): pure, a fake clock of
plain floats. Its load, scaling up and down, and no flapping; the bounds, scaling to and from zero
and the parameters: test_autoscaling_bounds.py.

Most cases drive `decide` through `Cluster` (tests/unit/autoscaling_helpers.py), a fake that feeds
the policy one load sample a second and brings requested replicas up `ready_after_s` later, so
that "current" and "target" replicas behave as they do under Ray Serve.
"""

from __future__ import annotations

import random

import pytest

from llmserve.policies.autoscaling import PolicyState, decide, desired_for
from tests.unit.autoscaling_helpers import Cluster, P, deployed, signals


def first_change_s(cluster: Cluster) -> float | None:
    changes = cluster.changes()
    return changes[0][0] if changes else None


def direction_changes(targets: list[int]) -> int:
    moves = [b - a for a, b in zip(targets, targets[1:]) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:]) if (a > 0) != (b > 0))


# -- desired_for, Signals --------------------------------------------------------------


@pytest.mark.parametrize(
    "load, expected",
    [
        (0, 0),
        (0.5, 1),
        (16, 1),
        (16.01, 2),
        (32, 2),
        (33, 3),
        (160, 10),
    ],
)
def test_desired_for(load, expected):
    assert desired_for(load, P) == expected


def test_load_is_queue_plus_engine_running_and_waiting():
    assert signals(queued=3, running=10, waiting=2).load == 15


# -- upscale ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, params, load, expect_at_s, expect_target",
    [
        ("after the 5 s delay, to ceil(load / target)", P, 40.0, 5.0, 3),
        ("just above one replica's target", P, 16.5, 5.0, 2),
        ("jumps straight to the count the load needs", P, 100.0, 5.0, 7),
        ("capped at max_replicas", P, 1000.0, 5.0, 8),
        (
            "zero delay upscales on the first sample",
            deployed(upscale_delay_s=0.0, max_replicas=8),
            40.0,
            0.0,
            3,
        ),
        ("longer delay", deployed(upscale_delay_s=30.0, max_replicas=8), 40.0, 30.0, 3),
        ("exactly at the target is not excess", P, 16.0, None, 1),
    ],
)
def test_upscale_after_sustained_excess(case, params, load, expect_at_s, expect_target):
    cluster = Cluster(params)
    cluster.run([load] * 40)
    assert first_change_s(cluster) == expect_at_s, case
    assert cluster.target == expect_target, case


def test_no_upscale_before_delay_and_a_dip_restarts_the_clock():
    cluster = Cluster(P)
    # 4 s of excess, one sample back at target, then excess again: the 5 s start at t=5.
    targets = cluster.run([40.0] * 4 + [10.0] + [40.0] * 10)
    assert targets[:10] == [1] * 10
    assert first_change_s(cluster) == 10.0
    assert cluster.target == 3


@pytest.mark.parametrize("samples_s", [[0.0, 2.5, 4.9], [0.0, 1.0, 2.0, 3.0, 4.0]])
def test_upscale_delay_counts_time_not_samples(samples_s):
    state = PolicyState()
    for now in samples_s:
        n, state = decide(signals(now, queued=40), P, state)
        assert n == 1, now
    n, state = decide(signals(5.0, queued=40), P, state)
    assert n == 3


def test_no_second_upscale_while_a_started_replica_is_coming_up():
    cluster = Cluster(P)  # replicas ready 60 s after they are asked for
    cluster.run([40.0] * 10)  # up to 3 at t=5
    assert cluster.changes() == [(5.0, 1, 3)]
    # The load keeps growing while the two replicas start: no second upscale until t=5+60.
    cluster.run([100.0] * 70, t0_s=10.0)
    assert cluster.changes() == [(5.0, 1, 3), (65.0, 3, 7)]


def test_second_upscale_allowed_once_the_replicas_are_up():
    cluster = Cluster(P, ready_after_s=10.0)  # faster than the policy's 60 s estimate
    cluster.run([40.0] * 20)  # up to 3 at t=5, all 3 running from t=15
    cluster.run([100.0] * 10, t0_s=20.0)  # current == target: only the 5 s delay applies
    assert cluster.changes() == [(5.0, 1, 3), (25.0, 3, 7)]


def test_a_replica_that_never_comes_up_does_not_block_upscaling_forever():
    cluster = Cluster(P, ready_after_s=10_000.0)  # stuck starting
    cluster.run([40.0] * 10)
    cluster.run([100.0] * 70, t0_s=10.0)
    # Past replica_start_s the policy stops waiting for the stuck replicas.
    assert cluster.changes() == [(5.0, 1, 3), (65.0, 3, 7)]


# -- downscale -------------------------------------------------------------------------


def test_downscale_after_quiet_period_one_step_at_a_time():
    cluster = Cluster(P, target=4)
    cluster.run([0.0] * 200)  # idle, but min_replicas 1
    # One replica per 60 s of quiet, each step restarting the clock: 4 -> 3 -> 2 -> 1.
    assert cluster.changes() == [(60.0, 4, 3), (121.0, 3, 2), (182.0, 2, 1)]


@pytest.mark.parametrize(
    "case, target, load, expect_down",
    [
        # Downscale from n needs load <= (n-1) x 16 x 0.8.
        ("fits in n-1 with headroom", 4, 38.4, True),
        ("fits in n-1 but not with the headroom", 4, 40.0, False),
        ("needs all n", 4, 60.0, False),
        ("two to one: <= 12.8", 2, 12.8, True),
        ("two to one: 13 is too much", 2, 13.0, False),
        ("never below min_replicas", 1, 0.0, False),
    ],
)
def test_downscale_only_when_load_fits_in_fewer_with_headroom(case, target, load, expect_down):
    cluster = Cluster(P, target=target)
    cluster.run([load] * 100)
    changes = cluster.changes()
    if expect_down:
        assert changes[0] == (60.0, target, target - 1), case
    else:
        assert changes == [], case


def test_downscale_clock_restarts_when_load_comes_back():
    cluster = Cluster(P, target=3)
    cluster.run([10.0] * 50 + [30.0] + [10.0] * 70)  # one busy sample at t=50
    assert cluster.changes() == [(111.0, 3, 2)]  # 60 s after the quiet resumed at t=51


def test_upscale_intent_cancels_downscale_intent():
    state = PolicyState()
    n, state = decide(signals(0.0, current=3, target=3, queued=10), P, state)
    assert (n, state.want_down_since_s) == (3, 0.0)
    n, state = decide(signals(1.0, current=3, target=3, queued=60), P, state)
    assert (n, state.want_down_since_s, state.want_up_since_s) == (3, None, 1.0)


# -- no flapping -----------------------------------------------------------------------


def noisy_load(seed: int, base: float, noise: float, seconds: int) -> list[float]:
    """base + white noise + a slow random walk, clipped at 0: a load hovering near a threshold."""
    rng, drift, out = random.Random(seed), 0.0, []
    for _ in range(seconds):
        drift = 0.98 * drift + rng.gauss(0.0, noise / 5)
        out.append(max(0.0, base + drift + rng.gauss(0.0, noise)))
    return out


NAIVE = deployed(
    max_replicas=8,
    upscale_delay_s=0.0,
    downscale_delay_s=0.0,
    downscale_headroom=1.0,
    replica_start_s=0.0,
)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("base", [30.0, 32.0, 34.0, 48.0])  # around the 2 -> 3 threshold (32)
def test_no_flapping_under_noisy_load_around_the_threshold(seed, base):
    loads = noisy_load(seed, base, noise=6.0, seconds=30 * 60)
    cluster = Cluster(P, target=2)
    targets = cluster.run(loads)
    # 30 minutes of load noisy around a threshold: at most one up and one down.
    assert direction_changes(targets) <= 2
    assert len(cluster.changes()) <= 4
    # The same load flaps a policy without delays or headroom: the test can see flapping.
    naive = Cluster(NAIVE, target=2)
    assert direction_changes(naive.run(loads)) > 50
