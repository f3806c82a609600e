"""The Ray Serve adapter of llmserve/policies/autoscaling.py: a custom autoscaling policy per model.

Each LLMServer replica reports, through `record_autoscaling_stats`, its engine's running and
waiting requests and the Router's queue for its model (`AutoscalingStats`); Ray aggregates each
over its look-back window into `ctx.aggregated_metrics` ({key: {replica: value}}), which
`AutoscalingStats.per_replica` reads back. With no replica yet (scale from zero) there are no
such metrics, and the requests Ray holds at the handle (`ctx.total_num_requests`: the Router
lets one through to wake the model) stand in for the load.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from llmserve.policies.autoscaling import AutoscalingParams, PolicyState, Signals, decide
from llmserve.protocol.replica_call import AutoscalingStats

logger = logging.getLogger("ray.serve")


class LLMQueueAutoscalingPolicy:
    def __init__(self, **params: Any) -> None:
        self._params = AutoscalingParams.from_dict(params)

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        reports = AutoscalingStats.per_replica(metrics).values()
        running = sum(r.engine_running for r in reports)
        waiting = sum(r.engine_waiting for r in reports)
        # Every replica reports the same Router queue: take it once.
        queued = max((r.router_queued for r in reports), default=0.0)
        if not metrics:
            queued = float(ctx.total_num_requests or 0)
        signals = Signals(
            now_s=ctx.current_time if ctx.current_time is not None else time.time(),
            current_replicas=ctx.current_num_replicas,
            target_replicas=ctx.target_num_replicas,
            router_queued=queued,
            engine_running=running,
            engine_waiting=waiting,
        )
        state = PolicyState(**(ctx.policy_state or {}).get("llmserve", {}))
        replicas, state = decide(signals, self._params, state)
        replicas = min(
            max(replicas, ctx.capacity_adjusted_min_replicas), ctx.capacity_adjusted_max_replicas
        )
        log = logger.info if replicas != ctx.target_num_replicas else logger.debug
        log(
            "autoscaling %s: %d -> %d replicas (router queue %.1f, engines running %.1f, "
            "waiting %.1f)",
            ctx.deployment_name,
            ctx.target_num_replicas,
            replicas,
            queued,
            running,
            waiting,
        )
        return replicas, {"llmserve": dataclasses.asdict(state)}
