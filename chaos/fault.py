"""One fault under steady load, measured: what failed, how, and when capacity was back.

A scenario supplies the load, the deployment that will lose a replica, and `choose`, which finds
the victim and returns its replica id and a function that kills it. The kill runs at a recorded
instant, so "in flight at the fault" is exact: a request counts there when it started before the
kill and ended after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from chaos.figures import ok_rate, summary
from chaos.load import Load, Result, running
from chaos.watch import ReplicaWatch, Sample, at_capacity


@dataclass
class Fault:
    name: str
    deployment: str  # the deployment whose capacity is measured
    target: int  # its replica count at full capacity
    # -> (victim id, kill); kill returns once the killed process is gone (a kill is a signal:
    # the process dies some milliseconds later, and requests sent meanwhile still reach it).
    choose: Callable[[ReplicaWatch], tuple[str, Callable[[], None]]]


def run_fault(
    fault: Fault, load: Load, app: str, before_s: float, after_s: float, recovery_timeout_s: float
) -> dict:
    watch = ReplicaWatch(app)

    def noticed(s: Sample) -> bool:
        return s.states.get(fault.deployment, {}).get("RUNNING", 0) < fault.target

    with running(watch, load):
        t0 = time.monotonic()
        time.sleep(before_s)
        victim, kill = fault.choose(watch)
        t_fault = time.monotonic()
        kill()
        t_dead = time.monotonic()
        t_back = watch.wait_for(
            lambda s: at_capacity(s, fault.deployment, fault.target, {victim}),
            recovery_timeout_s,
            after=t_fault,
        )
        time.sleep(after_s)  # the restored set carries the load for a while
        t_stop = time.monotonic()
    t_noticed = watch.first(noticed, after=t_fault)
    return fault_figures(load.results, t0, t_fault, t_noticed, t_back, t_stop, t_dead) | {
        "fault": fault.name,
        "victim": victim,
        "deployment": fault.deployment,
        "replicas": fault.target,
        "clients": load.num_clients,
        "max_tokens": load.max_tokens,
        "all_streams": load.all_streams,
        "deadline_s": load.deadline_s,
    }


def fault_figures(
    results: list[Result],
    t0: float,
    t_fault: float,
    t_noticed: float | None,
    t_back: float | None,
    t_stop: float,
    t_dead: float | None = None,
) -> dict:
    """Figures of a load that met one fault, from its kill at t_fault until the killed process
    was gone at t_dead; capacity was back at t_back (or not)."""
    t_dead = t_fault if t_dead is None else t_dead
    bad = [r for r in results if not r.ok]

    def in_flight(r: Result) -> bool:  # at some moment while the fault struck
        return r.start_s <= t_dead and r.end_s > t_fault

    return {
        "fault_at_s": round(t_fault - t0, 2),
        "fault_took_s": round(t_dead - t_fault, 3),
        "in_flight_at_fault": sum(1 for r in results if in_flight(r)),
        **summary(results, t0),
        # Failures of requests that were not in flight when the fault struck: the platform
        # should have routed them around it (retry before the first token, dead replica dropped).
        "failed_in_flight_at_fault": sum(1 for r in bad if in_flight(r)),
        "failed_started_after_fault": sum(1 for r in bad if r.start_s > t_dead),
        # How long the requests the fault broke waited for their answer (an error).
        "last_failure_answered_s": since(max((r.end_s for r in bad), default=None), t_fault),
        # The same from the moment the killed process was gone: what the platform can act on
        # (the kernel took 9.7 s to end a SIGKILL'd engine on a loaded 2-core host once).
        "last_failure_after_death_s": since(max((r.end_s for r in bad), default=None), t_dead),
        "serve_noticed_s": since(t_noticed, t_fault),
        "capacity_back_s": since(t_back, t_fault),
        "ok_per_s_before": round(ok_rate(results, t0 + 2, t_fault), 2),
        "ok_per_s_until_back": round(ok_rate(results, t_fault, t_back or t_stop), 2),
        "ok_per_s_after": round(ok_rate(results, t_back, t_stop), 2) if t_back else None,
    }


def since(t: float | None, t_ref: float) -> float | None:
    return None if t is None else round(t - t_ref, 2)
