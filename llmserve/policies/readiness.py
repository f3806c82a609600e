"""Which models cannot serve now, and why: what the Router's /readyz answers. Pure.

A model is ready once a replica of it runs. One allowed to scale to zero is ready with none: its
first request starts one (the Router lets it through to Ray's handle), so a probe must not hold
traffic back from it.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

NOT_KNOWN = "replica count not known yet"
NONE_RUNNING = "no replica running"


def not_ready(
    models: Iterable[str], live_replicas: Mapping[str, int], may_scale_to_zero: Container[str]
) -> dict[str, str]:
    """Each model of `models` that cannot serve, with why; empty when all can.
    `live_replicas` lacks a model until its count is first known."""
    reasons = {}
    for name in models:
        if name in may_scale_to_zero:
            continue
        num_replicas = live_replicas.get(name)
        if num_replicas is None:
            reasons[name] = NOT_KNOWN
        elif num_replicas == 0:
            reasons[name] = NONE_RUNNING
    return reasons
