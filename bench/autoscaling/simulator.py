"""The simulated deployment that bench/autoscaling/simulate.py runs traces through, under the same
`decide()` as the Ray adapter.

The model (one LLM deployment):
- requests arrive as a Poisson process whose rate follows the trace (one rate a second, seeded);
- each request holds one of a replica's `slots` (continuous batching) for `service_s`;
- a replica serves `replica_start_s` after it is asked for (model load), and is removed at once
  when the policy asks for fewer (the newest first; a replica being removed drains its requests);
- requests wait in one FIFO queue at the Router until a slot is free;
  TTFT = queue wait + `prefill_s`;
- every `control_period_s` the policy gets Signals from the simulation (router_queued =
  requests waiting at the Router, engine_running = slots busy, engine_waiting = 0 since the
  Router holds what the engines cannot take), each averaged over `look_back_s` as Ray averages
  the adapter's metrics over look_back_period_s, and its answer is applied at once.

Replica-seconds count every replica asked for, starting, running or draining.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from bench.autoscaling.traces import Trace
from llmserve.policies.autoscaling import (
    AutoscalingParams,
    PolicyState,
    Signals,
    decide,
    desired_for,
)


@dataclass(frozen=True)
class ReplicaModel:
    slots: int = 16  # concurrent sequences per replica (continuous batching)
    service_s: float = 4.0  # one request's slot time (e.g. ~200 tokens at ~50 tok/s a stream)
    prefill_s: float = 0.2
    replica_start_s: float = 60.0  # asked for -> serving (model load, engine start)
    control_period_s: float = 1.0  # the policy runs this often
    look_back_s: float = 2.0  # signals are means over this window (Ray's look_back_period_s)


# The shipped defaults (AutoscalingParams'), which this simulation chose for the model above on
# the daily trace (docs/autoscaling.md): the cheapest setting that keeps >= 99% within the TTFT
# target for every seed tried, with margin. Only the cluster's size is the trace's own, and the
# target is the default rule's for 16 slots (max_num_seqs less one).
SIM_PARAMS = AutoscalingParams(max_replicas=32).for_slots(ReplicaModel().slots)


@dataclass
class Run:
    """One simulation: per-request arrival and start times, and a timeline per control period."""

    arrival_s: np.ndarray
    start_s: np.ndarray  # inf where a request never got a slot before the end
    t_s: np.ndarray
    queued: np.ndarray
    running: np.ndarray
    target: np.ndarray  # replicas asked for
    ready: np.ndarray  # replicas serving
    replica_seconds: float
    duration_s: float


def arrivals(trace: Trace, seed: int, period_s: float = 1.0) -> np.ndarray:
    """Poisson arrivals at the trace's rate (piecewise constant per period), sorted, seeded."""
    rng = np.random.default_rng(seed)
    counts = rng.poisson(trace.rate_per_s * period_s)
    tick = np.repeat(np.arange(len(counts)) * period_s, counts)
    return np.sort(tick + rng.random(len(tick)) * period_s)


def simulate(
    trace: Trace,
    model: ReplicaModel = ReplicaModel(),
    params: AutoscalingParams | None = SIM_PARAMS,
    *,
    fixed_replicas: int | None = None,
    seed: int = 0,
    arrival_s: np.ndarray | None = None,
) -> Run:
    """Run the trace under `decide(params)`, or with `fixed_replicas` running all along."""
    period, service = model.control_period_s, model.service_s
    arr = arrivals(trace, seed, period) if arrival_s is None else arrival_s
    arr_list = arr.tolist()
    num_ticks = len(trace.rate_per_s)
    ticks = np.arange(num_ticks + 1) * period
    arrived_by = np.searchsorted(arr, ticks, side="left").tolist()  # arrivals before each tick

    starts: list[float] = []
    slots: list[tuple[float, int]] = []  # (free at, replica id); a min-heap over live slots
    requested_at: list[float] = []
    ready_at: list[float] = []
    ended_at: list[float | None] = []  # asked to go (None while live)
    last_end: list[float] = []  # its last request's end: when a removed replica has drained
    live: list[int] = []  # replica ids, oldest first

    def add(now: float, start_delay_s: float) -> None:
        rid = len(requested_at)
        requested_at.append(now)
        ready_at.append(now + start_delay_s)
        ended_at.append(None)
        last_end.append(now)
        live.append(rid)
        for _ in range(model.slots):
            heapq.heappush(slots, (now + start_delay_s, rid))

    def remove(now: float) -> None:
        ended_at[live.pop()] = now  # newest first: a starting one if any; its slots are dropped

    if fixed_replicas is not None:
        for _ in range(fixed_replicas):
            add(0.0, 0.0)
        target = fixed_replicas
    else:
        assert params is not None
        params = params.for_slots(model.slots)  # the target, where none is given, as deployed
        # Warm start: the trace begins where a steady state at its first rate would be (a day
        # follows the day before), with those replicas up.
        steady = desired_for(float(trace.rate_per_s[0]) * service, params)
        target = min(max(steady, params.min_replicas, 1), params.max_replicas)
        for _ in range(target):
            add(0.0, 0.0)
    state = PolicyState()

    queued_tl = np.zeros(num_ticks, dtype=np.int64)
    running_tl = np.zeros(num_ticks, dtype=np.int64)
    target_tl = np.zeros(num_ticks, dtype=np.int64)
    ready_tl = np.zeros(num_ticks, dtype=np.int64)
    window = max(1, round(model.look_back_s / period))
    i = 0  # next request to get a slot (FIFO)
    for k in range(num_ticks):
        now = k * period
        queued = arrived_by[k] - i
        running = i - bisect_right(starts, now - service, 0, i)  # starts never decrease (FIFO)
        ready = sum(1 for rid in live if ready_at[rid] <= now)
        queued_tl[k], running_tl[k] = queued, running
        if fixed_replicas is None:
            # Ray hands the policy each metric averaged over look_back_period_s.
            lo = max(0, k + 1 - window)
            signals = Signals(
                now_s=now,
                current_replicas=ready,
                target_replicas=target,
                router_queued=float(queued_tl[lo : k + 1].mean()),
                engine_running=float(running_tl[lo : k + 1].mean()),
                engine_waiting=0.0,
            )
            want, state = decide(signals, params, state)  # type: ignore[arg-type]
            while len(live) < want:
                add(now, model.replica_start_s)
            while len(live) > want:
                remove(now)
            target = want
        target_tl[k], ready_tl[k] = target, ready

        # Hand out slots that free up before the next tick, in arrival order.
        horizon, last = now + period, arrived_by[k + 1]
        while i < last and slots:
            free_at, rid = slots[0]
            if ended_at[rid] is not None:
                heapq.heappop(slots)  # a removed replica's slot
                continue
            if free_at >= horizon:
                break
            a = arr_list[i]
            start = a if a > free_at else free_at
            starts.append(start)
            heapq.heapreplace(slots, (start + service, rid))
            last_end[rid] = start + service
            i += 1

    end = num_ticks * period
    replica_seconds = sum(
        min(end, end if gone is None else max(gone, last_end[rid])) - requested_at[rid]
        for rid, gone in enumerate(ended_at)
    )
    start_s = np.full(len(arr), np.inf)
    start_s[:i] = starts
    return Run(
        arr, start_s, ticks[:-1], queued_tl, running_tl, target_tl, ready_tl, replica_seconds, end
    )
