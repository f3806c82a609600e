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


@dataclass(frozen=True)
class AutoscalingParams:
    """The policy's parameters. The defaults are the shipped ones (serve_app/config.py reads
    them) and the ones the trace-driven simulation chose and accepts (autoscaling/simulate.py,
    docs/autoscaling.md); only max_replicas, a cluster's size, differs there."""

    min_replicas: int = 1
    max_replicas: int = 2
    # Requests a replica should hold (running + waiting + its share of the Router's queue).
    # The config's default is its engine's max_num_seqs less one: a spare slot covers the
    # growth while a new replica starts.
    target_per_replica: float = 15.0
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 30.0
    downscale_headroom: float = 0.9  # scale down only if load <= (n-1) x target x headroom
    replica_start_s: float = 60.0  # how long a new replica takes to serve
    scale_to_zero_after_s: float = 300.0  # with min_replicas 0: idle this long -> 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.target_per_replica <= 0 or not 0 < self.downscale_headroom <= 1:
            raise ValueError("target_per_replica > 0 and 0 < downscale_headroom <= 1")
        durations_s = (
            self.upscale_delay_s,
            self.downscale_delay_s,
            self.replica_start_s,
            self.scale_to_zero_after_s,
        )
        if min(durations_s) < 0:
            raise ValueError("delays, replica_start_s and scale_to_zero_after_s must be >= 0")


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
    return math.ceil(load / p.target_per_replica) if load > 0 else 0


def decide(s: Signals, p: AutoscalingParams, state: PolicyState) -> tuple[int, PolicyState]:
    """The replica count to ask for now, and the state to pass next time."""
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

    fits_in_fewer = target > floor and s.load <= (target - 1) * p.target_per_replica * (
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


def _change(n: int, direction: int, now: float, state: PolicyState) -> tuple[int, PolicyState]:
    return n, replace(
        state,
        want_up_since_s=None,
        want_down_since_s=None,
        last_change_s=now,
        last_direction=direction,
    )
