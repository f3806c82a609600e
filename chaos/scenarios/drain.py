"""Scenario 3, graceful drain: the config changes under load and no request may fail.

Two changes in turn, each with `serve.run` of a new config while long requests are in flight:
(a) scale-in: the simulated model goes from 2 replicas to 1;
(b) redeploy: `max_tokens_default` changes, so every replica (Router and LLMServer) is replaced.
Both change the init arguments of every deployment (the Router and the LLMServers receive the
whole config), so Serve replaces each replica with one of the new version: a replica on its way
out stops taking requests and finishes those it holds, within `graceful_shutdown_timeout_s`.
Requests are 5 s long, so that many are mid-stream when the change lands.
"""

from __future__ import annotations

import time

from ray import serve

from chaos.apps import APP, SIM, app_args, sim_model
from chaos.cluster import ChaosCluster
from chaos.fault import since
from chaos.figures import summary
from chaos.load import Load, running
from chaos.watch import ReplicaWatch, at_capacity
from llmserve.app import build_app

LLM_SIM = f"llm-{SIM}"
GRACE_S = 30.0  # graceful_shutdown_timeout_s of the model's replicas
STEP_S, MAX_TOKENS = 0.25, 20  # 5 s requests


def _app(num_replicas: int, max_tokens_default: int = 256):
    model = sim_model(num_replicas, step_s=STEP_S, graceful_shutdown_timeout_s=GRACE_S)
    model["max_tokens_default"] = max_tokens_default
    return build_app(app_args([model]))


def run(short: bool, port_base: int) -> dict:
    before_s, settle_s = (8, 6) if short else (30, 30)
    with ChaosCluster(port_base=port_base) as cluster:
        serve.run(_app(2), name=APP, route_prefix="/")
        changes = {
            "scale_in": _change(cluster, _app(1), 1, before_s, settle_s),
            "redeploy": _change(cluster, _app(1, max_tokens_default=128), 1, before_s, settle_s),
        }
    return {
        "changes": changes,
        "graceful_shutdown_timeout_s": GRACE_S,
        "leftover_processes": cluster.leftover,
    }


def _change(cluster: ChaosCluster, new_app, target: int, before_s: float, settle_s: float) -> dict:
    watch = ReplicaWatch(APP)
    load = Load(cluster.url, SIM, num_clients=8, max_tokens=MAX_TOKENS, deadline_s=60)
    with running(watch, load):
        t0 = time.monotonic()
        time.sleep(before_s)
        old = {d: set(ids) for d, ids in watch.latest().ids.items()}
        t_change = time.monotonic()
        serve.run(new_app, name=APP, route_prefix="/")  # returns once the new version runs
        t_ready = time.monotonic()
        # Done when the old replicas are all gone and the new set is at its size.
        t_done = watch.wait_for(
            lambda s: (
                at_capacity(s, LLM_SIM, target, old[LLM_SIM])
                and at_capacity(s, "Router", 1, old["Router"])
            ),
            timeout_s=GRACE_S + 60,
            after=t_change,
        )
        time.sleep(settle_s)
        t_stop = time.monotonic()
    during = [s for s in watch.samples if t_change <= s.t <= (t_done or t_stop)]

    def fewest_running(deployment: str) -> int | None:
        return min((s.states.get(deployment, {}).get("RUNNING", 0) for s in during), default=None)

    results = load.results
    stopped = old[LLM_SIM] | old["Router"]
    # Served by a replica on its way out and still running when the change was asked for, or
    # sent to it after that (until the routers learn of the new version).
    drained = [r for r in results if r.replica in old[LLM_SIM] and r.end_s > t_change]
    return {
        "in_flight_at_change": sum(1 for r in results if r.in_flight_at(t_change)),
        "in_flight_on_old_replicas_at_change": sum(1 for r in drained if r.start_s < t_change),
        "finished_on_old_replicas_after_change": len(drained),
        "failed_on_old_replicas": sum(1 for r in drained if not r.ok),
        "last_finish_on_old_after_change_s": round(
            max((r.end_s for r in drained), default=t_change) - t_change, 2
        ),
        **summary(results, t0),
        "replaced_replicas": len(stopped),
        # The Routers: the Router is replaced new-before-old, so at least one always serves.
        "router_running_min": fewest_running("Router"),
        "model_running_min": fewest_running(LLM_SIM),
        "serve_run_returned_s": since(t_ready, t_change),
        "old_replicas_gone_s": since(t_done, t_change),
    }
