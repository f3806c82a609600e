"""Application wiring: the one place that binds the deployments together.

`serve run serve_config.yaml` calls `build_app(args)` with the config's `args:` block.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from llmserve.config import host_fit
from llmserve.config.app_config import AppConfig, ModelConfig
from llmserve.edge.host import cpu_flags
from llmserve.edge.ray_env import REPLICA_ENV
from llmserve.planning import model_source
from llmserve.policies.routing import ScoreWeights
from llmserve.replica import vllm_args
from llmserve.replica.llm_server import LLMServer
from llmserve.responses.response_store import ResponseStore
from llmserve.router.router import Router

logger = logging.getLogger(__name__)


def deployment_name(model: ModelConfig) -> str:
    return "llm-" + re.sub(r"[^A-Za-z0-9_.-]", "_", model.name)


ROUTER_DEPLOYMENT = "Router"
ROUTER_GRACE_MARGIN_S = 5.0  # past the longest deadline: time to answer it

REQUEST_ROUTERS = {  # routing.policy -> the request router class Serve loads
    "llm_aware": "llmserve.request_router.request_router:LLMAwareRequestRouter",
    "round_robin": "llmserve.request_router.request_router:RoundRobinRequestRouter",
    "ray_prefix_affinity": "llmserve.request_router.ray_prefix_router:RayPrefixAffinityRouter",
}


def request_router_config(
    model: ModelConfig, model_dir: str | None = None
) -> RequestRouterConfig | None:
    """`model_dir`: where the model's tokenizer is, for prefix-aware routing."""
    r = model.routing
    if r.policy == "ray_default":
        return None
    kwargs: dict[str, Any] = {}
    if r.policy == "llm_aware":
        kwargs = {
            "model": model.name,
            "session_affinity": r.session_affinity,
            "weights": ScoreWeights.of(r).to_dict(),
        }
        if r.prefix_aware and model_dir is not None:
            kwargs["prefix"] = {
                "model_dir": model_dir,
                "chat_template": model.server.chat_template,
            }
    return RequestRouterConfig(
        request_router_class=REQUEST_ROUTERS[r.policy],
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=r.stats_period_s,
        request_routing_stats_timeout_s=max(1.0, 2 * r.stats_period_s),
    )


def autoscaling_config(model: ModelConfig) -> dict[str, Any]:
    a = model.deployment.autoscaling
    params = a.for_slots(model.engine.max_num_seqs)
    return {
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "initial_replicas": max(a.min_replicas, 1),
        "metrics_interval_s": a.metrics_interval_s,
        # Our policy keeps its own delays and hysteresis; Ray's (30 s up, 600 s down by
        # default, applied on top of custom policies) would only stack on them.
        "upscale_delay_s": 0,
        "downscale_delay_s": 0,
        "downscale_to_zero_delay_s": 0,
        "look_back_period_s": max(2 * a.metrics_interval_s, 2.0),
        "policy": {
            "policy_function": "llmserve.autoscaling.ray_policy:LLMQueueAutoscalingPolicy",
            "policy_kwargs": params.to_dict(),
        },
    }


FLAG_CHECK_TIMEOUT_S = 300.0  # importing vllm takes 5-20 s; a stuck check must not stop a deploy
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def check_engine_flags(models: list[ModelConfig]) -> None:
    """vLLM's own parser over the argv of every model that passes flags of its own
    (`engine.extra`, `server.extra`: nothing of ours checks those), so that a bad one stops the
    deploy naming the model instead of every replica failing at start.

    In a subprocess (llmserve/replica/engine/vllm_engine.py), so that the driver never loads vllm or
    torch. Where the check cannot run (no vllm here, a timeout), it says so and passes: each
    replica still parses its flags at start."""
    checked = [m for m in models if m.source != "simulated" and (m.engine.extra or m.server.extra)]
    if not checked:
        return
    argvs = [vllm_args.launch(m, m.source, native_bf16=True).argv for m in checked]
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "llmserve.replica.engine.vllm_engine"],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=FLAG_CHECK_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": path},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.warning("vLLM's flags not checked before deploying (%r); replicas parse them", e)
        return
    prefix = vllm_args.FLAG_CHECK_PREFIX
    answers = [line[len(prefix) :] for line in run.stdout.splitlines() if line.startswith(prefix)]
    if run.returncode != 0 or len(answers) != 1:
        logger.warning(
            "vLLM's flags not checked before deploying (exit %d: %s); replicas parse them",
            run.returncode,
            run.stderr.strip()[-500:],
        )
        return
    errors = json.loads(answers[0])
    refused = [
        f"model {m.name!r}: vLLM refuses its flags: {error}. Fix: engine.extra takes "
        "vllm.AsyncEngineArgs fields and server.extra `vllm serve` flags, by their argument names"
        for m, error in zip(checked, errors)
        if error
    ]
    if refused:
        raise ValueError("; ".join(refused))


def build_app(args: dict[str, Any]) -> Application:
    config = AppConfig.model_validate(args)
    if not config.tenants:
        raise ValueError(
            "tenants: none configured, so no request could be served. Give a "
            "tenant its keys (api_key_env: [VAR] in production), or for a local "
            "demo set admission.anonymous_tenant to a tenant's name."
        )
    held_back = host_fit.held_back(config, platform.machine(), cpu_flags())
    reasons = list(dict.fromkeys(h.reason for h in held_back.values()))
    for why in reasons:
        logger.warning("%s", why)
    if held_back:
        try:
            config = host_fit.without(config, set(held_back))
        except ValueError as e:
            raise ValueError(f"{e}: {'; '.join(reasons)}") from None
    cache_dir = config.cache_dir()
    # Fail here, with the model's name and the fix, rather than in a replica crash loop.
    for model in config.models:
        model_source.check(model, cache_dir)
    check_engine_flags(config.models)
    # Stored Responses API turns, where every replica and Router reads them.
    store = (
        ResponseStore.bind(config.http.max_stored_responses)
        if config.http.max_stored_responses
        else None
    )
    handles = {}
    for model in config.models:
        d = model.deployment
        routing = request_router_config(model, model_source.tokenizer_dir(model, cache_dir))
        extra: dict[str, Any] = {"request_router_config": routing} if routing else {}
        if d.autoscaling is not None:
            extra["autoscaling_config"] = autoscaling_config(model)
        else:
            extra["num_replicas"] = d.num_replicas
        handles[model.name] = LLMServer.options(
            **extra,
            name=deployment_name(model),
            graceful_shutdown_timeout_s=d.graceful_shutdown_timeout_s,
            max_ongoing_requests=d.max_ongoing_requests,
            health_check_period_s=d.health_check_period_s,
            health_check_timeout_s=d.health_check_timeout_s,
            ray_actor_options={
                "num_cpus": d.num_cpus,
                "num_gpus": d.num_gpus,
                "runtime_env": {"env_vars": {**REPLICA_ENV, **d.env_vars}},
                **({"resources": dict(d.resources)} if d.resources else {}),
            },
        ).bind(
            model,
            str(cache_dir),
            tracing=config.tracing,
            num_router_replicas=config.router.num_replicas,
            response_store=store,
            # By name: the Router is bound after the models, whose handles it takes.
            router_deployment=ROUTER_DEPLOYMENT,
        )
    r = config.router
    # Ray Serve's default (20 s) would cut requests that may run for minutes on every change.
    grace_s = r.graceful_shutdown_timeout_s or ROUTER_GRACE_MARGIN_S + max(
        t.max_timeout_s for t in config.effective_tenants()
    )
    return Router.options(
        name=ROUTER_DEPLOYMENT,
        num_replicas=r.num_replicas,
        max_ongoing_requests=r.max_ongoing_requests,
        graceful_shutdown_timeout_s=grace_s,
        # On a config change, start the new Router before stopping the old: Serve's default
        # stops first, and requests arriving meanwhile wait in the proxy, where no deadline
        # applies (the chaos suite saw them hang for as long as the new Router took to start).
        max_surge_percent=100,
        ray_actor_options={"num_cpus": r.num_cpus, "runtime_env": {"env_vars": REPLICA_ENV}},
        # The Router writes its own access line per request (llmserve/router/request_log.py: tenant,
        # model, TTFT, replica); Serve's would be a second, a tenth of the CPU of a refusal.
        logging_config={"enable_access_log": False},
    ).bind(config.for_router(), handles, store, held_back)
