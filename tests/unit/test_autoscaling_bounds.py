"""The queue-length autoscaling policy (llmserve/policies/autoscaling.py) at its edges: the replica
bounds, scaling to and from zero, the parameters' validation, and `decide` being pure.

Pure, a fake clock of plain floats; `Cluster` and the shared parameters are in
tests/unit/autoscaling_helpers.py. Scaling up and down, and flapping: test_autoscaling_policy.py.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from llmserve.policies.autoscaling import AutoscalingParams, PolicyState, decide
from tests.unit.autoscaling_helpers import Cluster, P, deployed, signals

# -- bounds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, params, target, load, expected",
    [
        ("load wants more than max", P, 8, 10_000.0, 8),
        ("idle at min stays at min", deployed(min_replicas=2), 2, 0.0, 2),
        ("target below min is raised at once", deployed(min_replicas=2), 1, 0.0, 2),
        ("target zero below min is raised at once", deployed(min_replicas=2), 0, 0.0, 2),
        (
            "target above max (max lowered) is cut at once",
            deployed(max_replicas=4),
            6,
            0.0,
            4,
        ),
        (
            "target above max under load is cut at once",
            deployed(max_replicas=4),
            6,
            500.0,
            4,
        ),
    ],
)
def test_bounds_apply_at_once(case, params, target, load, expected):
    n, _ = decide(signals(0.0, current=target, target=target, queued=load), params, PolicyState())
    assert n == expected, case


@pytest.mark.parametrize("seed", range(5))
def test_never_outside_bounds_under_random_load(seed):
    rng = random.Random(seed)
    params = deployed(
        min_replicas=2,
        max_replicas=5,
        upscale_delay_s=2.0,
        downscale_delay_s=10.0,
        replica_start_s=5.0,
    )
    cluster = Cluster(params, target=2)
    cluster.run([rng.choice([0.0, 5.0, 40.0, 90.0, 400.0]) for _ in range(2000)])
    assert all(2 <= t <= 5 for _, t in cluster.history)


# -- scale to and from zero ------------------------------------------------------------

Z = deployed(min_replicas=0, max_replicas=4, scale_to_zero_after_s=300.0)


@pytest.mark.parametrize(
    "case, params, load, expected",
    [
        ("any load starts one replica at once, no delay", Z, 1.0, 1),
        ("even a large load starts one first", Z, 500.0, 1),
        ("min 0 and no load stays at zero", Z, 0.0, 0),
    ],
)
def test_from_zero(case, params, load, expected):
    n, state = decide(signals(0.0, current=0, target=0, queued=load), params, PolicyState())
    assert n == expected, case
    if expected == 1:
        assert state.last_change_s == 0.0 and state.last_direction == +1


def test_from_zero_then_the_rest_once_the_first_is_up():
    cluster = Cluster(Z, target=0, ready_after_s=30.0)
    cluster.run([100.0] * 80)
    # One at once; the rest waits until that one is up (here after 30 s), by when the excess
    # has lasted longer than the upscale delay.
    assert cluster.changes() == [(0.0, 0, 1), (30.0, 1, 4)]


def test_scale_to_zero_after_idle_period():
    cluster = Cluster(Z, target=1)
    cluster.run([0.0] * 400)
    assert cluster.changes() == [(300.0, 1, 0)]


def test_load_resets_the_idle_clock():
    cluster = Cluster(Z, target=1)
    cluster.run([0.0] * 200 + [1.0] + [0.0] * 350)
    assert cluster.changes() == [(501.0, 1, 0)]


def test_min_one_never_goes_to_zero():
    cluster = Cluster(P, target=1)
    cluster.run([0.0] * 1000)
    assert cluster.changes() == []


def test_scale_to_zero_from_several_replicas_waits_for_the_idle_period():
    cluster = Cluster(replace(Z, downscale_delay_s=600.0), target=3)
    cluster.run([0.0] * 400)
    assert cluster.changes() == [(300.0, 3, 0)]


# -- params ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(min_replicas=3, max_replicas=2), "min_replicas 3 > max_replicas 2"),
        (dict(min_replicas=-1), "min_replicas must be >= 0"),
        (dict(min_replicas=0, max_replicas=0), "max_replicas must be >= 1"),
        (dict(target_per_replica=0), "target_per_replica must be > 0"),
        (dict(target_per_replica=-1), "target_per_replica must be > 0"),
        (dict(downscale_headroom=0), "downscale_headroom must be > 0"),
        (dict(downscale_headroom=1.01), "downscale_headroom must be <= 1"),
        (dict(upscale_delay_s=-1), "upscale_delay_s must be >= 0"),
        (dict(downscale_delay_s=-0.5), "downscale_delay_s must be >= 0"),
        (dict(replica_start_s=-1), "replica_start_s must be >= 0"),
        (dict(scale_to_zero_after_s=-1), "scale_to_zero_after_s must be > 0"),
        (dict(scale_to_zero_after_s=0), "scale_to_zero_after_s must be > 0"),
    ],
)
def test_params_validation(kwargs, named):
    with pytest.raises(ValueError, match=named):
        AutoscalingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(min_replicas=0, max_replicas=1),
        dict(min_replicas=4, max_replicas=4),
        dict(downscale_headroom=1.0, upscale_delay_s=0, downscale_delay_s=0, replica_start_s=0),
    ],
)
def test_params_accepted(kwargs):
    AutoscalingParams(**kwargs)


@pytest.mark.parametrize(
    "target_per_replica, num_slots, expected",
    [
        (None, 16, 15.0),  # a spare slot covers the growth while a replica starts
        (None, 64, 63.0),
        (None, 1, 1.0),  # never zero
        (4.0, 64, 4.0),  # given: kept
    ],
)
def test_for_slots_sets_the_target(target_per_replica, num_slots, expected):
    params = AutoscalingParams(target_per_replica=target_per_replica).for_slots(num_slots)
    assert params.target_per_replica == expected
    assert type(params) is AutoscalingParams


def test_decide_needs_the_target_set():
    with pytest.raises(ValueError, match="for_slots"):
        decide(signals(0.0, queued=10), AutoscalingParams(), PolicyState())


def test_decide_is_pure():
    s, state = signals(10.0, current=2, target=2, queued=70), PolicyState(want_up_since_s=1.0)
    first = decide(s, P, state)
    assert decide(s, P, state) == first
    assert state == PolicyState(want_up_since_s=1.0)  # the input state is not mutated
