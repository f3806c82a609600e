"""Helpers shared by the integration test modules, so that no test module imports another.

Plain functions and constants, imported by name; conftest.py keeps the fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import httpx
import psutil

from tests.integration.apps import CALL_TIMEOUT_S, CLIENT_TIMEOUT_S, ENGINE_READY_S, KEYS, TINY
from tests.integration.conftest import engine_stats

SIM = "sim-model"


def auth(tenant: str) -> dict[str, str]:
    """The Authorization header of one of the test apps' tenants (conftest KEYS)."""
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


SIM_KEY = auth("metered")


def send_at_once(
    base_url: str | httpx.URL,
    n: int,
    path: str,
    headers: dict[str, str] | list[dict[str, str]],
    body: dict,
    timeout_s: float = CLIENT_TIMEOUT_S,
) -> tuple[list[httpx.Response], float]:
    """n POSTs of `body` to `path` sent at once (`headers` for all, or a list of one per request),
    and the seconds until the last answer. One after another, each would wait for the previous
    one to be served, and on a slow host the token bucket refills in between: whether a 429 came
    would measure the host, not the limit."""
    each = headers if isinstance(headers, list) else [headers] * n
    assert len(each) == n, (n, len(each))

    async def send():
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as c:
            t0 = time.monotonic()
            rs = await asyncio.gather(*(c.post(path, json=body, headers=h) for h in each))
            return list(rs), time.monotonic() - t0

    return asyncio.run(send())


def sim_stats():
    from ray import serve

    return (
        serve.get_deployment_handle("llm-sim-model", app_name="sim")
        .stats.remote()
        .result(timeout_s=CALL_TIMEOUT_S)
    )


def wait_idle(http: httpx.Client, timeout_s: float = CALL_TIMEOUT_S) -> dict:
    """Engines of the tiny and the simulated model hold no request; the Router nothing in flight."""
    deadline = time.monotonic() + timeout_s
    while True:
        tiny, sim = engine_stats(TINY), sim_stats()
        health = http.get("/healthz", headers=auth("interactive"))  # per model: with a key
        models = health.json()["models"]
        busy = {m: s for m, s in models.items() if s["in_flight"] or s["queued"]}
        if not (tiny.num_unfinished or sim.num_unfinished or busy) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert health.status_code == 200
    assert (tiny.num_unfinished, tiny.num_running, tiny.kv_cache_usage) == (0, 0, 0.0), tiny
    assert (sim.num_unfinished, sim.num_running) == (0, 0), sim
    assert not busy, models
    return models


def cluster_processes(tmp: str) -> list[psutil.Process]:
    """Every process of a cluster `make serve` started with its Ray temp dir (RAY_TMPDIR) in
    `tmp`: they name that folder, or descend from one that does."""
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if tmp in " ".join(p.info["cmdline"] or []):
                found[p.pid] = p
                for c in p.children(recursive=True):
                    found[c.pid] = c
        except psutil.Error:
            continue
    return list(found.values())


def tiny_engine(max_num_seqs: int) -> dict:
    """The engine block of the apps that run the tiny random model on two replicas."""
    return {
        "dtype": "auto",
        "enforce_eager": True,
        "max_model_len": 1024,
        "max_num_seqs": max_num_seqs,
        "cpu_kv_cache_space_gib": 1,
    }


def wait_running(app: str, deployments: list[str], replicas: int = 2) -> None:
    """A deploy's replicas start one engine each: ~30 s here, 320 s seen on a slow hour's CI;
    measuring while one still starts would measure the start, not what the test is about."""
    from ray import serve

    deadline, states = time.monotonic() + ENGINE_READY_S, {}
    while time.monotonic() < deadline:
        ds = serve.status().applications[app].deployments
        states = {name: (ds[name].status, ds[name].replica_states) for name in deployments}
        if all(v == ("HEALTHY", {"RUNNING": replicas}) for v in states.values()):
            return
        time.sleep(1)
    raise AssertionError(f"{app}: replicas not all running within {ENGINE_READY_S} s: {states}")


@contextlib.contextmanager
def deployed_app(
    cluster_url: str,
    args: dict,
    name: str,
    prefix: str,
    deployments: list[str],
    replicas: int = 2,
) -> Iterator[str]:
    """The app deployed on the test cluster, `replicas` of each deployment running: its URL;
    deleted after."""
    from ray import serve

    from llmserve.app import build_app

    serve.run(build_app(args), name=name, route_prefix=prefix)
    try:
        wait_running(name, deployments, replicas)
        yield f"{cluster_url}{prefix}"
    finally:
        serve.delete(name)
