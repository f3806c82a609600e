"""Why the request router chose a replica, handed to the Router that sent the request.

Both run in the Router's process (the request router inside its DeploymentHandle), so the note
is kept in a small module-level map by request id: the request router puts it, the Router takes
it once the replica answered, for the trace span and the `x-route` debug header. Bounded: notes
of requests that never come back (a handle call from another app) fall out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from llmserve.policies.routing import Choice

MAX_NOTES = 4096
_notes: OrderedDict[str, RouteNote] = OrderedDict()


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

    @classmethod
    def of(
        cls, choice: Choice, block_tokens: int, adapter_holders: frozenset[str] | None = None
    ) -> RouteNote:
        cached = dict(choice.cached_blocks)
        winner = choice.replica_id
        others = [(r, s) for r, s in choice.candidates if r != winner]
        runner_up, runner_up_load = others[0] if others else ("", 0.0)
        return cls(
            choice.reason,
            winner,
            dict(choice.candidates).get(winner, 0.0),
            cached.get(winner, 0) * block_tokens,
            runner_up,
            runner_up_load,
            cached.get(runner_up, 0) * block_tokens,
            None if adapter_holders is None else winner in adapter_holders,
        )

    def _fields(self) -> dict[str, str | float | int | bool]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def attributes(self) -> dict[str, str | float | int | bool]:
        return {f"llmserve.route.{k}": v for k, v in self._fields().items()}

    def header(self) -> str:
        return "; ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self._fields().items()
        )


def put(request_id: str, note: RouteNote) -> None:
    _notes[request_id] = note
    while len(_notes) > MAX_NOTES:
        _notes.popitem(last=False)


def take(request_id: str) -> RouteNote | None:
    return _notes.pop(request_id, None)


def peek(request_id: str) -> RouteNote | None:
    return _notes.get(request_id)
