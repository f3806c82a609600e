"""How many replicas of each LLM deployment are running, as this process's request routers last
heard it from Ray.

Ray pushes a deployment's running replicas to each handle's request router whenever they change
(a long poll on the Serve controller); llmserve/request_router/request_router.py notes the count
here, and the Router's admission reads it. Ray builds a handle's request router at the handle's
first request, so until then the Router asks the controller (`serve.status`) instead. That call
costs the Router and the controller CPU every 2 s (the whole app's status, parsed into pydantic
models); with the counts pushed here it stops after each model's first request, and admission
follows a scale-up as soon as Ray's own routing does.
"""

from __future__ import annotations

from collections.abc import Mapping

_counts: dict[tuple[str, str], int] = {}  # (app, deployment) -> running replicas


def note(app: str, deployment: str, num_replicas: int) -> None:
    _counts[(app, deployment)] = num_replicas


def split(app: str, deployments: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
    """For each model of `deployments` (model -> deployment name): its noted count, or the model
    among those whose count must still be asked of the controller."""
    known: dict[str, int] = {}
    unknown: list[str] = []
    for model, deployment in deployments.items():
        n = _counts.get((app, deployment))
        if n is None:
            unknown.append(model)
        else:
            known[model] = n
    return known, unknown
