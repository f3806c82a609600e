"""Queue-length-driven replica count for one model. Pure: signals and state in, decision out.

The load is what the model must hold at once: requests in its engines (running + waiting) plus
requests waiting for it in the Router's queue. The desired count serves that load at
`target_per_replica` requests a replica. Scaling up answers quickly (after `upscale_delay_s` of
sustained excess, and not again while a started replica is still coming up); scaling down waits
for `downscale_delay_s` of quiet and steps one replica at a time, only when the load would fit in
one fewer replica with `downscale_headroom` to spare. The two delays and that headroom are the
hysteresis that keeps noisy load from flapping the count. With `min_replicas: 0` a model idle for
`scale_to_zero_after_s` goes to zero, and any request (the Router holds it) brings one back.
Shaped like Ray Serve's replica_queue_length_autoscaling_policy: a function that returns the new
state rather than keeping it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated

from annotated_types import Ge, Gt, Le

from llmserve.policies.params import Params

Seconds = Annotated[float, Ge(0)]  # a delay or a duration; 0: none


# kw_only: nine numbers in a row, too easy to swap by position.
@dataclass(frozen=True, kw_only=True)
class AutoscalingParams(Params):
    """The policy's parameters, and the `deployment.autoscaling:` config block (which adds
    Ray's `metrics_interval_s`, llmserve/config/app_config.py). The defaults are the shipped ones
    and the ones the trace-driven simulation chose and accepts (bench/autoscaling/simulator.py
    SIM_PARAMS, docs/autoscaling.md); only max_replicas, a cluster's size, differs there."""

    min_replicas: Annotated[int, Ge(0)] = 1
    max_replicas: Annotated[int, Ge(1)] = 2
    # Requests a replica should hold (running + waiting + its share of the Router's queue).
    # None: its engine's slots (max_num_seqs) less one, filled in by `for_slots`: a spare slot
    # covers the growth while a new replica starts.
    target_per_replica: Annotated[float, Gt(0)] | None = None
    upscale_delay_s: Seconds = 5.0
    downscale_delay_s: Seconds = 30.0
    # Scale down only if the load fits in one fewer replica at this fraction:
    # load <= (n-1) x target x headroom.
    downscale_headroom: Annotated[float, Gt(0), Le(1)] = 0.9
    replica_start_s: Seconds = 60.0  # how long a new replica takes to serve
    # With min_replicas 0: idle this long -> 0. Not 0 itself: every idle sample would go to
    # zero, and the next request would wait for a replica to start.
    scale_to_zero_after_s: Annotated[float, Gt(0)] = 300.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")

    def for_slots(self, num_slots: int) -> AutoscalingParams:
        """These parameters with the target set: as given, or `num_slots` less one."""
        params = AutoscalingParams.of(self)
        if params.target_per_replica is not None:
            return params
        return replace(params, target_per_replica=max(1.0, num_slots - 1.0))


@dataclass(frozen=True)
class Signals:
    now_s: float
    current_replicas: int  # running
    target_replicas: int  # what the last decision asked for (some may still be starting)
    router_queued: float  # waiting in the Router's queue for this model
    engine_running: float  # summed over replicas
    engine_waiting: float  # summed over replicas

    @property
    def load(self) -> float:
        return self.router_queued + self.engine_running + self.engine_waiting


@dataclass(frozen=True)
class PolicyState:
    want_up_since_s: float | None = None
    want_down_since_s: float | None = None
    idle_since_s: float | None = None
    last_change_s: float | None = None
    last_direction: int = 0  # +1 up, -1 down, 0 none yet


def desired_for(load: float, p: AutoscalingParams) -> int:
    return math.ceil(load / _target(p)) if load > 0 else 0


def decide(s: Signals, p: AutoscalingParams, state: PolicyState) -> tuple[int, PolicyState]:
    """The replica count to ask for now, and the state to pass next time. `p` has its target
    set (`for_slots`)."""
    target_per_replica = _target(p)
    now, target = s.now_s, s.target_replicas
    if s.load > 0:
        idle_since = None
    else:
        idle_since = state.idle_since_s if state.idle_since_s is not None else now
    state = replace(state, idle_since_s=idle_since)

    # Bounds first: a target outside [min, max] (bounds changed by a redeploy) is corrected at
    # once, not after a delay.
    if target < p.min_replicas:
        return _change(p.min_replicas, +1, now, state)
    if target > p.max_replicas:
        return _change(p.max_replicas, -1, now, state)

    # From zero: any load brings one replica at once; nothing else can serve it.
    if target == 0:
        if s.load > 0:
            return _change(1, +1, now, state)
        return 0, state

    floor = max(p.min_replicas, 1)
    idle_s = 0.0 if idle_since is None else now - idle_since
    if p.min_replicas == 0 and idle_since is not None and idle_s >= p.scale_to_zero_after_s:
        return _change(0, -1, now, state)

    want = min(max(desired_for(s.load, p), floor), p.max_replicas)
    if want > target:
        since = state.want_up_since_s if state.want_up_since_s is not None else now
        starting = (
            target > s.current_replicas
            and state.last_change_s is not None
            and (now - state.last_change_s < p.replica_start_s)
        )
        if now - since >= p.upscale_delay_s and not starting:
            return _change(want, +1, now, state)
        return target, replace(state, want_up_since_s=since, want_down_since_s=None)

    fits_in_fewer = target > floor and s.load <= (target - 1) * target_per_replica * (
        p.downscale_headroom
    )
    if fits_in_fewer:
        since = state.want_down_since_s if state.want_down_since_s is not None else now
        if now - since >= p.downscale_delay_s:
            return _change(target - 1, -1, now, state)
        return target, replace(state, want_down_since_s=since, want_up_since_s=None)
    return min(max(target, floor), p.max_replicas), replace(
        state, want_up_since_s=None, want_down_since_s=None
    )


def _target(p: AutoscalingParams) -> float:
    if p.target_per_replica is None:
        raise ValueError("target_per_replica is not set: call for_slots(num_slots) first")
    return p.target_per_replica


def _change(n: int, direction: int, now: float, state: PolicyState) -> tuple[int, PolicyState]:
    return n, replace(
        state,
        want_up_since_s=None,
        want_down_since_s=None,
        last_change_s=now,
        last_direction=direction,
    )
