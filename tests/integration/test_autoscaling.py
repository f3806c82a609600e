"""Queue-driven autoscaling on the real stack: 1 -> 2 replicas under load, back to 1 after it,
with no failed request during either change (a replica being removed drains first), and the
Router's admission following the count (its /healthz capacity: max_ongoing_requests a replica)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from ray import serve

from bench.client import send
from llmserve.app import build_app
from tests.integration.apps import CLIENT_TIMEOUT_S, ENGINE_READY_S, KEYS, TINY

PREFIX = "/autoscale"
NAME = "tiny-auto"
# The load runs until the second replica has served a while, up to ENGINE_READY_S, and the
# test gets its time.
pytestmark = pytest.mark.timeout(2 * ENGINE_READY_S + 600)


def autoscale_app(model_dirs) -> dict:
    return {
        "models": [
            {
                "name": NAME,
                "source": str(model_dirs[TINY]),
                "engine": {
                    "dtype": "auto",
                    "enforce_eager": True,
                    "max_model_len": 512,
                    "max_num_seqs": 8,
                    "cpu_kv_cache_space_gib": 1,
                },
                "deployment": {
                    "max_ongoing_requests": 8,
                    "num_cpus": 0.5,
                    "autoscaling": {
                        "min_replicas": 1,
                        "max_replicas": 2,
                        "target_per_replica": 4,
                        "upscale_delay_s": 2,
                        "downscale_delay_s": 10,
                        "replica_start_s": 360,
                        "metrics_interval_s": 1,
                    },
                    "health_check_period_s": 30,
                    "health_check_timeout_s": 180,
                },
                "health": {"probe_timeout_s": 120},  # as the shared app's: see conftest
            }
        ],
        "admission": {"max_queue_wait_s": 180, "anonymous_tenant": "anonymous"},
        "tenants": [
            {"name": "anonymous", "default_timeout_s": 300},
            {"name": "operator", "api_keys": [KEYS["interactive"]]},  # sees /healthz per model
        ],
    }


def _running() -> int:
    d = serve.status().applications["autoscale"].deployments[f"llm-{NAME}"]
    return d.replica_states.get("RUNNING", 0)


def _capacity(url: str) -> int:
    """How many requests the Router admits to the model's replicas at once."""
    auth = {"Authorization": f"Bearer {KEYS['interactive']}"}
    health = httpx.get(f"{url}/healthz", headers=auth, timeout=30).json()
    return health["models"][NAME]["capacity"]


def test_load_scales_one_to_two_and_back_without_failures(serve_cluster, model_dirs):
    serve.run(build_app(autoscale_app(model_dirs)), name="autoscale", route_prefix=PREFIX)
    url = f"{serve_cluster}{PREFIX}"
    timeline: list[tuple[float, int]] = []
    capacities: list[tuple[int, int]] = []  # (running replicas, the Router's capacity)
    results: list[int] = []

    async def scenario():
        t0 = time.monotonic()
        state = {"scaled_up_at": None, "stop": False}

        async def watch():
            while not state["stop"]:
                n = await asyncio.to_thread(_running)
                timeline.append((time.monotonic() - t0, n))
                capacities.append((n, await asyncio.to_thread(_capacity, url)))
                if n == 2 and state["scaled_up_at"] is None:
                    state["scaled_up_at"] = time.monotonic()
                await asyncio.sleep(1)

        async def client(c: httpx.AsyncClient, k: int):
            i = 0
            while not state["stop"]:
                up, now = state["scaled_up_at"], time.monotonic()
                if (up and now > up + 15) or now - t0 > ENGINE_READY_S:
                    return
                body = {
                    "model": NAME,
                    "prompt": f"Load {k}-{i}",
                    "max_tokens": 64,
                    "ignore_eos": True,
                }
                r = await send(c, "/v1/completions", body, record_errors=False)
                results.append(r.status)
                i += 1

        watcher = asyncio.create_task(watch())
        async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as c:
            await asyncio.gather(*(client(c, k) for k in range(12)))
            load_end = time.monotonic() - t0
            # Idle now: wait for the way back down, probing lightly to see nothing fails.
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and _running() != 1:
                body = {"model": NAME, "prompt": "probe", "max_tokens": 4}
                r = await send(c, "/v1/completions", body, record_errors=False)
                results.append(r.status)
                await asyncio.sleep(2)
        state["stop"] = True
        await watcher
        return load_end

    try:
        load_end = asyncio.run(scenario())
        changes = [(round(t), n) for (t, n), (_, prev) in zip(timeline[1:], timeline) if n != prev]
        print(
            f"\nreplica count changes (s, running): {changes}; load ended at {load_end:.0f} s; "
            f"{len(results)} requests, statuses {sorted(set(results))}"
        )
        assert max(n for _, n in timeline) == 2, "never scaled up"
        assert timeline[-1][1] == 1 or _running() == 1, "never scaled back down"
        assert set(results) == {200}, "a request failed during scaling"
        # Admission follows the running count within a few seconds each way (8 per replica).
        print(f"(running, capacity) seen: {sorted(set(capacities))}")
        assert (2, 16) in capacities, "the Router never admitted for two replicas"
        deadline = time.monotonic() + 10
        while (last := _capacity(url)) != 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert last == 8, "the Router still admits for two replicas after the scale-in"
    finally:
        serve.delete("autoscale")
