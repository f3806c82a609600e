"""Scenario 4, soak: steady load for a while; memory must not creep and nothing may fail.

One app with the simulated model and the tiny real model (one replica each, one Router), both
under load for the whole run. The resident memory of the proxy, the Serve controller, the
Router, each LLMServer replica and the vLLM engine processes is sampled after a warm-up and then
regularly; the figures are each process's start, end, growth and its trend in MB per minute.
"""

from __future__ import annotations

import time

from ray import serve

from chaos.apps import APP, SIM, TINY, app_args, sim_model, tiny_model, tiny_model_dir
from chaos.cluster import ChaosCluster
from chaos.figures import summary
from chaos.load import Load, running
from chaos.procs import add_engine, rss_mb, serve_processes
from llmserve.app import build_app


def run(short: bool, port_base: int) -> dict:
    warmup_s, soak_s, every_s = (15, 60, 5) if short else (60, 600, 30)
    tiny = tiny_model_dir()
    with ChaosCluster(port_base=port_base) as cluster:
        args = app_args([sim_model(1), tiny_model(tiny, 1)])
        serve.run(build_app(args), name=APP, route_prefix="/")
        loads = [
            Load(cluster.url, SIM, num_clients=4, max_tokens=10, deadline_s=30),
            Load(cluster.url, TINY, num_clients=4, max_tokens=32, deadline_s=60),
        ]
        with running(*loads):
            time.sleep(warmup_s)  # first requests fill caches, pools and arenas: not a leak
            procs = _with_engine_process()
            t0 = time.monotonic()
            samples = [(0.0, rss_mb(procs))]
            while time.monotonic() - t0 < soak_s:
                time.sleep(min(every_s, soak_s - (time.monotonic() - t0)))
                samples.append((time.monotonic() - t0, rss_mb(procs)))
        results = [r for load in loads for r in load.results]
    return {
        "soak_s": soak_s,
        "warmup_s": warmup_s,
        "load": {load.model: summary(load.results, t0) for load in loads},
        "requests_per_s": round(sum(r.ok for r in results) / (soak_s + warmup_s), 2),
        "rss_mb": memory_figures(samples),
        "leftover_processes": cluster.leftover,
    }


def _with_engine_process() -> dict:
    """The app's processes, the tiny model's vLLM engine among them, found by the pid its
    replica reports rather than by its title alone."""
    procs = serve_processes(APP)
    stats = serve.get_deployment_handle(f"llm-{TINY}", app_name=APP).stats.remote()
    engine_pid = stats.result(timeout_s=30).extra["engine_pid"]
    if add_engine(procs, engine_pid) is None:
        print(f"engine pid {engine_pid} is below none of {sorted(procs)}", flush=True)
    return procs


def memory_figures(samples: list[tuple[float, dict[str, float]]]) -> dict[str, dict]:
    """Per process: RSS at start and end, growth, and the least-squares trend in MB/min."""
    out = {}
    for role, start in samples[0][1].items():
        series = [(t, rss[role]) for t, rss in samples if role in rss]
        end = series[-1][1]
        out[role] = {
            "start": start,
            "end": end,
            "growth": round(end - start, 1),
            "growth_pct": round(100 * (end - start) / start, 1),
            "trend_mb_per_min": round(60 * _slope(series), 2),
            "alive_to_the_end": len(series) == len(samples),
        }
    return out


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0
