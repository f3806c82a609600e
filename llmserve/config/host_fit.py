"""The models of a config that this host's CPU cannot run, and the config without them.

A model whose engine would load and then die on its first forward pass (its quantization's
kernel is missing from the vLLM build for this CPU: llmserve/config/quantization.py) is held
back: left out of the app, so that the other models serve and `serve status` says RUNNING, while
a request naming it gets a 404 that says why instead of a replica crash loop.

Read on the host that builds the app (`serve run`, or the controller for `serve deploy`), which
is where a one-node cluster's replicas run; a cluster of CPU workers unlike their head is not
checked here, and each engine still fails as vLLM makes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmserve.config.app_config import AppConfig
from llmserve.config.lora_config import served_names
from llmserve.config.quantization import cpu_host_blocker


@dataclass(frozen=True)
class HeldBack:
    """A `model` name this app does not serve on this host, and why."""

    reason: str
    # The tenants that may use the name, who alone hear the reason (others get the 404 of a
    # model that does not exist); None: every tenant.
    tenants: tuple[str, ...] | None

    def told_to(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


def held_back(config: AppConfig, arch: str, flags: frozenset[str] | None) -> dict[str, HeldBack]:
    """Every `model` name (a model's, its adapters') whose model cannot run on a CPU with
    `flags` (llmserve/edge/host.py cpu_flags) -> why. GPU and simulated models are not
    checked: vLLM's CUDA minima are config-time checks (quantization.check_model)."""
    reasons = {
        m.name: f"model {m.name!r} is not served on this host: {why}"
        for m in config.models
        if m.source != "simulated"
        and m.deployment.num_gpus == 0
        and (why := cpu_host_blocker(m.quantize, arch, flags))
    }
    everyone = all(t.models is None for t in config.tenants)
    out = {}
    for name, base in served_names(config.models).items():
        if base in reasons:
            users = [t.name for t in config.tenants if t.models is None or name in t.models]
            out[name] = HeldBack(reasons[base], None if everyone else tuple(users))
    return out


def without(config: AppConfig, names: set[str]) -> AppConfig:
    """The config with the models (and their adapters) serving `names` left out, and those
    names left out of the tenants' `models` lists; raises ValueError when no model is left."""
    kept = [m for m in config.models if m.name not in names]
    if not kept:
        raise ValueError("no model of this config runs on this host")
    raw = config.model_dump()
    raw["models"] = [m.model_dump() for m in kept]
    for t in raw["tenants"]:
        if t["models"] is not None:
            t["models"] = [n for n in t["models"] if n not in names]
    return AppConfig.model_validate(raw)
