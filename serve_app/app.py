"""Application wiring: the one place that binds the deployments together.

`serve run serve_config.yaml` calls `build_app(args)` with the config's `args:` block.
"""

from __future__ import annotations

import re
from typing import Any

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deployments.llm_server import LLMServer
from deployments.router import Router
from serve_app import model_source
from serve_app.config import AppConfig, ModelConfig


def deployment_name(model: ModelConfig) -> str:
    return "llm-" + re.sub(r"[^A-Za-z0-9_.-]", "_", model.name)


ROUTERS = {
    "llm_aware": "deployments.request_router:LLMAwareRequestRouter",
    "round_robin": "deployments.request_router:RoundRobinRequestRouter",
}


def request_router_config(model: ModelConfig) -> RequestRouterConfig | None:
    r = model.routing
    if r.policy == "ray_default":
        return None
    kwargs = {}
    if r.policy == "llm_aware":
        kwargs = {
            "session_affinity": r.session_affinity,
            "weights": {"waiting": r.waiting_weight, "kv_cache": r.kv_cache_weight,
                        "max_affinity_score": r.max_affinity_score},
        }  # fmt: skip
    return RequestRouterConfig(
        request_router_class=ROUTERS[r.policy],
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=r.stats_period_s,
        request_routing_stats_timeout_s=max(1.0, 2 * r.stats_period_s),
    )


def build_app(args: dict[str, Any]) -> Application:
    config = AppConfig.model_validate(args)
    cache_dir = config.cache_dir()
    # Fail here, with the model's name and the fix, rather than in a replica crash loop.
    for model in config.models:
        model_source.check(model, cache_dir)
    handles = {}
    for model in config.models:
        d = model.deployment
        routing = request_router_config(model)
        extra = {"request_router_config": routing} if routing is not None else {}
        handles[model.name] = LLMServer.options(
            **extra,
            name=deployment_name(model),
            num_replicas=d.num_replicas,
            max_ongoing_requests=d.max_ongoing_requests,
            health_check_period_s=d.health_check_period_s,
            health_check_timeout_s=d.health_check_timeout_s,
            ray_actor_options={
                "num_cpus": d.num_cpus,
                "num_gpus": d.num_gpus,
                "runtime_env": {"env_vars": d.env_vars} if d.env_vars else {},
            },
        ).bind(model, str(cache_dir), tracing=config.tracing)
    r = config.router
    return Router.options(
        num_replicas=r.num_replicas,
        max_ongoing_requests=r.max_ongoing_requests,
        ray_actor_options={"num_cpus": r.num_cpus},
    ).bind(config.model_dump(), handles)
