"""Why the request router chose a replica, handed to the Router that sent the request.

Both run in the Router's process (Ray runs a handle's request router inside it), and the request
router sees the very `ReplicaRequest` the Router passed to the handle: Ray copies the argument
list, not its items, until it sends the request to the replica (ray/serve/_private/router.py,
`PendingRequest(args=list(request_args))`). So the request carries a `RouteSlip` that the
request router fills in and the Router reads once the replica answered, for the trace span and
the `x-route` debug header. A retry (`dataclasses.replace`) keeps the same slip: the note is the
last routing's.
"""

from __future__ import annotations

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


@dataclass(eq=False)
class RouteSlip:
    """Filled in by the request router, read by the Router (see the module's docstring)."""

    note: RouteNote | None = None
