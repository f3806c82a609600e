"""What the request router tells the Router that sent a request: why it chose a replica, and
how many replicas of the model run.

Both run in the Router's process (Ray runs a handle's request router inside it), and the request
router sees the very `ReplicaRequest` the Router passed to the handle: Ray copies the argument
list, not its items, until it sends the request to the replica (ray/serve/_private/router.py,
`PendingRequest(args=list(request_args))`). So the request carries a `RouteSlip` that the
request router fills in and the Router reads once the replica answered, for the trace span and
the `x-route` debug header. A retry (`dataclasses.replace`) keeps the same slip: the note is the
last routing's.

The slip also carries the Router's `ReplicaCounts`: the request router keeps it from the first
request it routes and writes every change of the running replica set Ray pushes it into it, so
that admission follows a scale-up (or a scale to zero, while no request comes) as soon as Ray's
own routing does. Until a model's first request the Router asks the Serve controller instead.
Neither crosses to the replica: a slip pickles as its note alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RouteNote:
    reason: str
    replica: str
    load: float
    cached_tokens: int
    runner_up: str = ""
    runner_up_load: float = 0.0
    runner_up_cached_tokens: int = 0
    # For a request naming a LoRA adapter: whether the chosen engine held it (else it loads it
    # first); None for a request for the base model.
    adapter_held: bool | None = None

    def _fields(self) -> dict[str, str | float | int | bool]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def attributes(self) -> dict[str, str | float | int | bool]:
        return {f"llmserve.route.{k}": v for k, v in self._fields().items()}

    def header(self) -> str:
        return "; ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self._fields().items()
        )


class ReplicaCounts:
    """One Router's view of its models' running replicas, by deployment name, as the request
    routers of its process last heard it from Ray."""

    def __init__(self) -> None:
        self._by_deployment: dict[str, int] = {}

    def note(self, deployment: str, num_replicas: int) -> None:
        self._by_deployment[deployment] = num_replicas

    def split(self, deployments: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
        """For each model of `deployments` (model -> deployment name): its noted count, or the
        model among those whose count must still be asked of the controller."""
        known: dict[str, int] = {}
        unknown: list[str] = []
        for model, deployment in deployments.items():
            n = self._by_deployment.get(deployment)
            if n is None:
                unknown.append(model)
            else:
                known[model] = n
        return known, unknown


@dataclass(eq=False)
class RouteSlip:
    """Filled in by the request router, read by the Router (see the module's docstring)."""

    note: RouteNote | None = None
    replica_counts: ReplicaCounts | None = None

    def __getstate__(self) -> dict:
        return {"note": self.note}  # the counts are the Router's process's, not the replica's

    def __setstate__(self, state: dict) -> None:
        self.note, self.replica_counts = state["note"], None
