"""The queue-length autoscaling policy (autoscaling/policy.py): pure, a fake clock of plain floats.

Most cases drive `decide` through `Cluster`, a fake that feeds the policy one load sample a second
and brings requested replicas up `ready_after_s` later, so that "current" and "target" replicas
behave as they do under Ray Serve.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from autoscaling.policy import AutoscalingParams, PolicyState, Signals, decide, desired_for

P = AutoscalingParams(
    min_replicas=1,
    max_replicas=8,
    target_per_replica=16.0,
    upscale_delay_s=5.0,
    downscale_delay_s=60.0,
    downscale_headroom=0.8,
    replica_start_s=60.0,
    scale_to_zero_after_s=300.0,
)


def signals(now_s=0.0, current=1, target=1, queued=0.0, running=0.0, waiting=0.0) -> Signals:
    return Signals(
        now_s=now_s,
        current_replicas=current,
        target_replicas=target,
        router_queued=queued,
        engine_running=running,
        engine_waiting=waiting,
    )


@dataclass
class Cluster:
    """Requested replicas become ready `ready_after_s` later; removals take starting ones first."""

    params: AutoscalingParams
    target: int = 1
    ready_after_s: float | None = None  # default: params.replica_start_s
    ready_at_s: list[float] = field(default_factory=list)
    state: PolicyState = field(default_factory=PolicyState)
    history: list[tuple[float, int]] = field(default_factory=list)  # (now_s, target) per step

    def __post_init__(self) -> None:
        self.ready_at_s = [float("-inf")] * self.target
        self.initial_target = self.target

    def current(self, now_s: float) -> int:
        return sum(1 for t in self.ready_at_s if t <= now_s)

    def step(self, now_s: float, load: float) -> int:
        s = signals(now_s, self.current(now_s), self.target, queued=load)
        new_target, self.state = decide(s, self.params, self.state)
        delay = self.params.replica_start_s if self.ready_after_s is None else self.ready_after_s
        while len(self.ready_at_s) < new_target:
            self.ready_at_s.append(now_s + delay)
        if new_target < len(self.ready_at_s):
            self.ready_at_s = sorted(self.ready_at_s)[:new_target]  # drop starting ones first
        self.target = new_target
        self.history.append((now_s, new_target))
        return new_target

    def run(self, loads, t0_s: float = 0.0, dt_s: float = 1.0) -> list[int]:
        return [self.step(t0_s + i * dt_s, load) for i, load in enumerate(loads)]

    def changes(self) -> list[tuple[float, int, int]]:
        """(now_s, from, to) for each change of the target."""
        out, prev = [], self.initial_target
        for now_s, target in self.history:
            if target != prev:
                out.append((now_s, prev, target))
            prev = target
        return out


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
            AutoscalingParams(upscale_delay_s=0.0, max_replicas=8),
            40.0,
            0.0,
            3,
        ),
        ("longer delay", AutoscalingParams(upscale_delay_s=30.0, max_replicas=8), 40.0, 30.0, 3),
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


# -- bounds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, params, target, load, expected",
    [
        ("load wants more than max", P, 8, 10_000.0, 8),
        ("idle at min stays at min", AutoscalingParams(min_replicas=2), 2, 0.0, 2),
        ("target below min is raised at once", AutoscalingParams(min_replicas=2), 1, 0.0, 2),
        ("target zero below min is raised at once", AutoscalingParams(min_replicas=2), 0, 0.0, 2),
        (
            "target above max (max lowered) is cut at once",
            AutoscalingParams(max_replicas=4),
            6,
            0.0,
            4,
        ),
        (
            "target above max under load is cut at once",
            AutoscalingParams(max_replicas=4),
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
    params = AutoscalingParams(
        min_replicas=2,
        max_replicas=5,
        upscale_delay_s=2.0,
        downscale_delay_s=10.0,
        replica_start_s=5.0,
    )
    cluster = Cluster(params, target=2)
    cluster.run([rng.choice([0.0, 5.0, 40.0, 90.0, 400.0]) for _ in range(2000)])
    assert all(2 <= t <= 5 for _, t in cluster.history)


# -- no flapping -----------------------------------------------------------------------


def noisy_load(seed: int, base: float, noise: float, seconds: int) -> list[float]:
    """base + white noise + a slow random walk, clipped at 0: a load hovering near a threshold."""
    rng, drift, out = random.Random(seed), 0.0, []
    for _ in range(seconds):
        drift = 0.98 * drift + rng.gauss(0.0, noise / 5)
        out.append(max(0.0, base + drift + rng.gauss(0.0, noise)))
    return out


NAIVE = AutoscalingParams(
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


# -- scale to and from zero ------------------------------------------------------------

Z = AutoscalingParams(min_replicas=0, max_replicas=4, scale_to_zero_after_s=300.0)


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
    "kwargs",
    [
        dict(min_replicas=3, max_replicas=2),
        dict(min_replicas=-1),
        dict(min_replicas=0, max_replicas=0),
        dict(target_per_replica=0),
        dict(target_per_replica=-1),
        dict(downscale_headroom=0),
        dict(downscale_headroom=1.01),
        dict(upscale_delay_s=-1),
        dict(downscale_delay_s=-0.5),
        dict(replica_start_s=-1),
        dict(scale_to_zero_after_s=-1),
    ],
)
def test_params_validation(kwargs):
    with pytest.raises(ValueError):
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


def test_decide_is_pure():
    s, state = signals(10.0, current=2, target=2, queued=70), PolicyState(want_up_since_s=1.0)
    first = decide(s, P, state)
    assert decide(s, P, state) == first
    assert state == PolicyState(want_up_since_s=1.0)  # the input state is not mutated
