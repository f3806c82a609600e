"""Shared by the autoscaling policy's unit tests (test_autoscaling_policy.py,
test_autoscaling_bounds.py): the parameters most cases use (`P`, or `deployed` with some
changed), a Signals builder, and `Cluster`, a fake that feeds the policy one load sample a
second and brings requested replicas up `ready_after_s` later, so that "current" and "target"
replicas behave as they do under Ray Serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve.policies.autoscaling import AutoscalingParams, PolicyState, Signals, decide

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
SLOTS = 16  # per replica: the simulator's, so the target where a case gives none is 15


def deployed(**kwargs) -> AutoscalingParams:
    """The parameters as the app deploys them for replicas of SLOTS slots."""
    return AutoscalingParams(**kwargs).for_slots(SLOTS)


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
