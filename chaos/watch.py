"""Serve's view of one app over time: replica states per deployment and live replica ids.

Recovery is judged from here, as an operator would see it: a deployment is back at full capacity
when `serve.status()` shows exactly its target number of RUNNING replicas and the live replica ids
(from the replicas' actor names) no longer include the victim. Both conditions are needed: right
after a kill, serve.status() may still count the dead replica as RUNNING.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass

REPLICA_PREFIX = "SERVE_REPLICA::"


@dataclass
class Sample:
    t: float  # time.monotonic()
    states: dict[str, dict[str, int]]  # deployment -> {replica state: count}
    ids: dict[str, set[str]]  # deployment -> live replica ids


def snapshot(app: str) -> Sample:
    import ray
    from ray import serve

    if not ray.is_initialized():  # serve.status() would connect to whatever Ray it finds
        raise RuntimeError("not connected to the scenario's cluster")
    status = serve.status().applications.get(app)
    states = (
        {name: dict(d.replica_states) for name, d in status.deployments.items()} if status else {}
    )
    ids: dict[str, set[str]] = defaultdict(set)
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if actor["namespace"] == "serve" and name.startswith(f"{REPLICA_PREFIX}{app}#"):
            _, deployment, replica_id = name.split("#")
            ids[deployment].add(replica_id)
    return Sample(time.monotonic(), states, dict(ids))


def at_capacity(s: Sample, deployment: str, target: int, gone: set[str] = frozenset()) -> bool:
    ids = s.ids.get(deployment, set())
    return (
        s.states.get(deployment) == {"RUNNING": target} and len(ids) == target and not (ids & gone)
    )


class ReplicaWatch:
    """Samples `snapshot(app)` every `period_s` in a thread, from start() until stop()."""

    def __init__(self, app: str, period_s: float = 0.5) -> None:
        self.app, self.period_s = app, period_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ReplicaWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(snapshot(self.app))
            except Exception:  # the controller busy or restarting: try again next period
                pass
            self._stop.wait(self.period_s)

    def latest(self) -> Sample:
        while not self.samples:
            time.sleep(self.period_s / 2)
        return self.samples[-1]

    def wait_for(self, predicate, timeout_s: float, after: float = 0.0) -> float | None:
        """The time of the first sample after `after` that satisfies `predicate`, or None."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.samples):
                s, seen = self.samples[seen], seen + 1
                if s.t >= after and predicate(s):
                    return s.t
            time.sleep(self.period_s / 2)
        return None

    def first(self, predicate, after: float = 0.0) -> float | None:
        return next((s.t for s in self.samples if s.t >= after and predicate(s)), None)
