"""The scenarios, by name, each with its own block of ports (19300-19399 are ours)."""

from __future__ import annotations

import importlib

# name -> (module:function, first port of its block of ten)
SCENARIOS = {
    "replica-death-engine": ("chaos.scenarios.replica_death:run_engine", 19300),
    "replica-death-actors": ("chaos.scenarios.replica_death:run_actors", 19340),
    "node-loss": ("chaos.scenarios.node_loss:run", 19310),
    "drain": ("chaos.scenarios.drain:run", 19320),
    "soak": ("chaos.scenarios.soak:run", 19330),
}


def run(name: str, short: bool) -> dict:
    target, port_base = SCENARIOS[name]
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)(short=short, port_base=port_base)
