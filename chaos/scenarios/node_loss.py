"""Scenario 2, node loss: a two-node cluster loses its worker node under load, then gets it back.

Each node offers one `llm_slot` and each LLMServer replica needs one, so the two replicas of the
simulated model land one per node; the worker node has no CPUs, so the Router, the Serve
controller and the proxy stay on the head. Replicas are small (3 sequences each) and the load
saturates both, so throughput shows the capacity lost and regained.
The worker node is killed outright (raylet, object store, workers: SIGKILL), as a machine that
loses power. The survivor must carry the load meanwhile; once the node is back, Serve must place
the missing replica there.
"""

from __future__ import annotations

import time

import ray
from ray import serve
from ray._private import ray_constants

from chaos.apps import APP, SIM, app_args, sim_model
from chaos.cluster import ChaosCluster
from chaos.fault import fault_figures, since
from chaos.figures import ok_rate
from chaos.load import Load, running
from chaos.procs import replicas_below
from chaos.watch import ReplicaWatch, at_capacity
from llmserve.app import build_app

LLM_SIM = f"llm-{SIM}"
SLOT = {"llm_slot": 1}
SEQS_PER_REPLICA = 3


def _raylet_pid(node) -> int:
    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def _node_alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def run(short: bool, port_base: int) -> dict:
    before_s, survivor_s, after_s = (10, 15, 10) if short else (30, 60, 30)
    with ChaosCluster(port_base=port_base, head_resources=SLOT) as cluster:
        worker = cluster.add_worker(num_cpus=0, resources=SLOT)
        model = sim_model(2, num_cpus=0, resources=SLOT, max_ongoing_requests=SEQS_PER_REPLICA)
        model["engine"]["max_num_seqs"] = SEQS_PER_REPLICA
        serve.run(build_app(app_args([model])), name=APP, route_prefix="/")
        placement = {
            "head": len(replicas_below(_raylet_pid(cluster.cluster.head_node), APP, LLM_SIM)),
            "worker": len(replicas_below(_raylet_pid(worker), APP, LLM_SIM)),
        }
        assert placement == {"head": 1, "worker": 1}, f"replicas per node: {placement}"
        # Twice what two replicas hold: the Router queues the rest, so replicas never idle.
        load = Load(
            cluster.url, SIM, num_clients=4 * SEQS_PER_REPLICA, max_tokens=10, deadline_s=30
        )
        figures = _lose_and_regain(cluster, worker, load, before_s, survivor_s, after_s)
    return {"placement": placement, **figures, "leftover_processes": cluster.leftover}


def _lose_and_regain(
    cluster: ChaosCluster, worker, load: Load, before_s: float, survivor_s: float, after_s: float
) -> dict:
    watch = ReplicaWatch(APP)
    with running(watch, load):
        t0 = time.monotonic()
        time.sleep(before_s)
        ids_before = set(watch.latest().ids[LLM_SIM])
        worker_id = worker.node_id
        t_fault = time.monotonic()
        cluster.remove_worker(worker)
        t_node_dead = _wait(lambda: not _node_alive(worker_id), timeout_s=120)
        t_noticed = watch.wait_for(
            lambda s: s.states.get(LLM_SIM, {}).get("RUNNING", 0) < 2, 120, after=t_fault
        )
        # The lost replica is the one whose actor Ray declares dead with the node.
        t_actor_dead = watch.wait_for(
            lambda s: ids_before - s.ids.get(LLM_SIM, set()), 120, after=t_fault
        )
        gone = ids_before - watch.latest().ids.get(LLM_SIM, set())
        time.sleep(survivor_s)  # the survivor alone carries the load
        t_readd = time.monotonic()
        cluster.add_worker(num_cpus=0, resources=SLOT)
        t_back = watch.wait_for(lambda s: at_capacity(s, LLM_SIM, 2, gone), 120, after=t_readd)
        time.sleep(after_s)
        t_stop = time.monotonic()
    results = load.results
    survivor_from = t_noticed or t_fault
    figures = fault_figures(results, t0, t_fault, t_noticed, None, t_stop)
    for key in ("capacity_back_s", "ok_per_s_until_back", "ok_per_s_after"):
        figures.pop(key)  # here capacity comes back only when the node does
    return figures | {
        "lost_replicas": sorted(gone),
        # Requests the replica on the returned node served: capacity back, whatever the cores did.
        "served_by_new_replica": sum(
            1 for r in results if r.ok and r.replica and r.replica not in ids_before
        ),
        "node_declared_dead_s": since(t_node_dead, t_fault),
        "replica_actor_dead_s": since(t_actor_dead, t_fault),
        "replica_back_after_node_added_s": since(t_back, t_readd),
        "clients": load.num_clients,
        "deadline_s": load.deadline_s,
        "seqs_per_replica": SEQS_PER_REPLICA,
        "ok_per_s_until_noticed": round(ok_rate(results, t_fault, survivor_from), 2),
        "ok_per_s_survivor_only": round(ok_rate(results, survivor_from + 2, t_readd), 2),
        "ok_per_s_after_back": round(ok_rate(results, t_back + 2, t_stop), 2) if t_back else None,
    }


def _wait(predicate, timeout_s: float, period_s: float = 0.5) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(period_s)
    return None
