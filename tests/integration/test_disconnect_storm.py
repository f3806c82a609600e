"""A storm of client disconnects: hundreds of streams dropped at random points leave nothing behind.

200 streams against a simulated model behind two Router replicas (its own app here, without rate
limits, so that every stream is admitted or queued) and 40 against the real tiny model, each ended
by the client at a random point: before the response headers (task cancelled), right after them,
after a random number of SSE chunks, or by a client timeout on a non-streamed request. Afterwards
the engines run and hold nothing, KV usage is back to idle, and the Routers' in-flight and queue
gauges (Ray's metrics export) and /healthz read zero.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter

import httpx
import pytest
from ray import serve

from llmserve.app import build_app
from llmserve.config.app_config import AppConfig
from tests.integration.apps import (
    CALL_TIMEOUT_S,
    CLIENT_TIMEOUT_S,
    METRICS_PORT,
    SLOW_HOST_DEADLINE_S,
    TINY,
    app_args,
)
from tests.integration.conftest import engine_stats
from tests.integration.helpers import auth

PREFIX = "/storm"
APP = "storm"
MODEL = "storm-sim"
NUM_SIM_STREAMS = 200
NUM_TINY_STREAMS = 40
MAX_NUM_SEQS = 16  # the simulated engine runs 16 at once and keeps a waiting line
ROUTER_CAP = 48  # in flight per model, over both Router replicas: the rest wait in their queues
DRAIN_S = 120
# The storm app's deadlines: a leaked request or queue entry is reaped at the earlier of the two,
# which must come after the drain is judged, or the drain would pass by the reaping.
STORM_TIMEOUT_S = SLOW_HOST_DEADLINE_S
STORM_QUEUE_WAIT_S = 180
SIM_STEP_S = 0.02
# Each simulated stream's max_tokens: 20 s a stream unaborted, while clients leave within their
# first CUT_WITHIN_CHUNKS chunks (1 s), so a storm that failed to abort would keep the engine
# busy for minutes after the last client left.
SIM_TOKENS = 1000
CUT_WITHIN_CHUNKS = 50
# How clients leave, by weight: cancel-task, close-at-headers, close-after-chunks, timeout.
# Non-streamed requests whose client times out only in the real engine's short runs: behind
# HAProxy the Router does not see such a client leave (test_routing.py's non-streamed test),
# so a long one runs on to its end.
ALL_ENDINGS = (2, 2, 5, 1)
STREAMS_ONLY = (2, 2, 5, 0)
# After the last client leaves, the engines hold nothing within this (the status polls every
# 0.5 s; a loaded host is slow to cancel a few hundred tasks).
IDLE_WITHIN_S = 5
TINY_TOKENS = 600
TINY_STORM_WITHIN_S = 25  # from the first tiny stream to its engine idle


def storm_app() -> dict:
    return {
        "router": {"num_replicas": 2, "num_cpus": 0.25},
        "models": [
            {
                "name": MODEL,
                "source": "simulated",
                "simulation": {"step_s": SIM_STEP_S},
                "engine": {"max_num_seqs": MAX_NUM_SEQS},
                "deployment": {"max_ongoing_requests": ROUTER_CAP, "num_cpus": 0.25},
            }
        ],
        "admission": {
            "max_queue_len": 256,
            "max_queue_wait_s": STORM_QUEUE_WAIT_S,
            "anonymous_tenant": "anonymous",
        },
        "tenants": [{"name": "anonymous", "default_timeout_s": STORM_TIMEOUT_S}],
    }


def reaped_after_s(args: dict) -> float:
    """When an app's own deadlines would end a leaked anonymous request (or queue entry)."""
    config = AppConfig.model_validate(args)
    anonymous = next(
        t for t in config.effective_tenants() if t.name == config.admission.anonymous_tenant
    )
    return min(anonymous.default_timeout_s, config.admission.max_queue_wait_s)


@pytest.fixture(scope="module")
def storm_url(serve_app):
    serve.run(build_app(storm_app()), name=APP, route_prefix=PREFIX)
    yield f"{serve_app}{PREFIX}"
    serve.delete(APP)


def sim_stats():
    return (
        serve.get_deployment_handle(f"llm-{MODEL}", app_name=APP)
        .stats.remote()
        .result(timeout_s=CALL_TIMEOUT_S)
    )


def gauges(metric: str, application: str, model: str) -> dict[str, float]:
    """A Router gauge of one model, per Router replica, from Ray's metrics export."""
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=60).text
    values = {}
    for line in text.splitlines():
        if (
            line.startswith(metric + "{")
            and f'application="{application}"' in line
            and f'model="{model}"' in line
        ):
            labels, value = line.rsplit(" ", 1)
            replica = labels.split('replica="', 1)[1].split('"', 1)[0]
            values[f"{metric.removeprefix('ray_llmserve_')}[{replica}]"] = float(value)
    return values


async def one(
    c: httpx.AsyncClient, model: str, max_tokens: int, rng: random.Random, weights
) -> str:
    """One request the client gives up on at a random point; returns how it ended."""
    body = {
        "model": model,
        "prompt": "Tell me a long story",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    how = rng.choices(
        ["cancel-task", "close-at-headers", "close-after-chunks", "timeout"], weights=weights
    )[0]
    if how == "cancel-task":  # gone before or during admission and dispatch
        task = asyncio.create_task(c.post("/v1/completions", json=body))
        await asyncio.sleep(rng.uniform(0, 0.3))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return how
        return "finished-first"
    if how == "timeout":  # a non-streamed request whose client stops waiting
        try:
            await c.post(
                "/v1/completions", json={**body, "stream": False}, timeout=rng.uniform(0.05, 1.0)
            )
            return "finished-first"
        except httpx.TimeoutException:
            return how
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        if how == "close-at-headers":
            return how
        wanted, got = rng.randint(1, min(CUT_WITHIN_CHUNKS, max_tokens // 2)), 0
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                got += 1
                if got >= wanted:
                    return how  # leaving the block closes the connection mid-stream
    return "finished-first"


async def storm(
    url: str, model: str, num: int, max_tokens: int, seed: int, weights=ALL_ENDINGS
) -> Counter:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=num + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as c:
        tasks = []
        for _ in range(num):
            tasks.append(asyncio.create_task(one(c, model, max_tokens, rng, weights)))
            await asyncio.sleep(rng.uniform(0, 0.01))  # all launched within about a second
        return Counter(await asyncio.gather(*tasks))


def all_zero(figures: dict) -> bool:
    return not any(figures.values())


def wait_for(check, timeout_s: float = DRAIN_S, done=all_zero):
    """Polls `check()` (a dict of figures) until `done(figures)`; returns (seconds, figures)."""
    t0 = time.monotonic()
    while True:
        figures = check()
        if done(figures) or time.monotonic() - t0 > timeout_s:
            return time.monotonic() - t0, figures
        time.sleep(0.5)


def test_two_hundred_dropped_streams_leave_nothing_behind(storm_url, base_url):
    # Warm: the Routers' handles know the replica, so the storm measures the steady path.
    for _ in range(4):
        r = httpx.post(
            f"{storm_url}/v1/completions",
            timeout=CALL_TIMEOUT_S,
            json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
        )
        assert r.status_code == 200
    busy: dict[str, float] = {}  # the peak of each figure while the storm lasts
    saturated: list[tuple[int, int]] = []  # (running, waiting) read together with a line waiting

    def snapshot():
        s = sim_stats()
        queues = (
            serve.get_app_handle(APP).queue_stats.remote().result(timeout_s=CALL_TIMEOUT_S)[MODEL]
        )
        for k, v in (
            ("running", s.num_running),
            ("waiting", s.num_waiting),
            ("kv", s.kv_cache_usage),
            ("router in_flight", queues["in_flight"]),
            ("router queued", queues["queued"]),
        ):
            busy[k] = max(busy.get(k, 0), v)
        if s.num_waiting > 0:
            saturated.append((s.num_running, s.num_waiting))

    def full() -> bool:
        # Every slot taken while a line waited, in one reading. A client that leaves frees its
        # slot at once and the engine's next step (20 ms on) refills it from the line, so with
        # clients leaving by the dozen a second a reading may fall in that gap: one slot short
        # still counts, a half-empty engine does not.
        return (
            any(running >= MAX_NUM_SEQS - 1 for running, _ in saturated)
            and busy.get("router in_flight", 0) > 0
        )

    async def run():
        task = asyncio.create_task(
            storm(storm_url, MODEL, NUM_SIM_STREAMS, SIM_TOKENS, seed=9, weights=STREAMS_ONLY)
        )
        # Mid-storm: the engine full, with waiting lines. Sampled for as long as the storm lasts,
        # since a slow host stretches it and moves its peak.
        while not task.done() and not full():
            await asyncio.sleep(0.2)
            await asyncio.to_thread(snapshot)
        return await task

    t0 = time.monotonic()
    endings = asyncio.run(run())
    storm_s = time.monotonic() - t0
    assert sum(endings.values()) == NUM_SIM_STREAMS
    assert endings["finished-first"] < NUM_SIM_STREAMS / 10, endings

    def engine():
        s = sim_stats()
        return {
            "running": s.num_running,
            "waiting": s.num_waiting,
            "unfinished": s.num_unfinished,
            "kv": s.kv_cache_usage,
        }

    def routers():
        return {
            **gauges("ray_llmserve_in_flight", APP, MODEL),
            **gauges("ray_llmserve_queue_depth", APP, MODEL),
        }

    engine_s, engine_after = wait_for(engine)
    # The gauges are exported every 2 s and scraped every second: at least one fresh export
    # first, as an older one may still read the zeros from before the storm.
    time.sleep(4)
    router_s, router_after = wait_for(routers, done=lambda f: len(f) == 4 and all_zero(f))
    total_s = storm_s + engine_s + 4 + router_s
    print(
        f"\n{NUM_SIM_STREAMS} streams on the simulated model, ended by the client in "
        f"{storm_s:.1f} s: {dict(endings)}; mid-storm peaks {dict(busy)}; engine idle "
        f"{engine_s:.1f} s after the last client left: {engine_after}; Router gauges after "
        f"{router_s + 4:.1f} s: {router_after}"
    )
    assert full(), f"the engine was never full: {busy}, readings with a line {saturated}"
    assert not any(engine_after.values()), engine_after
    # Unaborted, the streams would keep the engine busy for the whole of their tokens, waves of
    # MAX_NUM_SEQS at SIM_STEP_S a token; aborted, it is idle within a small part of that.
    unaborted_s = math.ceil(NUM_SIM_STREAMS / MAX_NUM_SEQS) * SIM_TOKENS * SIM_STEP_S
    assert engine_s < IDLE_WITHIN_S < (unaborted_s - storm_s) / 2, (engine_s, storm_s, unaborted_s)
    assert len(router_after) == 4, router_after  # in-flight and queue of each of 2 replicas
    assert not any(router_after.values()), router_after
    reaped_s = reaped_after_s(storm_app())
    assert total_s < reaped_s, f"drained in {total_s:.0f} s, no sooner than deadlines reap"
    # And the model still serves.
    r = httpx.post(
        f"{storm_url}/v1/completions",
        timeout=30,
        json={"model": MODEL, "prompt": "Hi", "max_tokens": 5},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_dropped_streams_on_the_real_engine_free_its_kv_cache(base_url, model_dirs):
    t0 = time.monotonic()
    endings = asyncio.run(storm(base_url, TINY, NUM_TINY_STREAMS, TINY_TOKENS, seed=7))
    storm_s = time.monotonic() - t0
    assert sum(endings.values()) == NUM_TINY_STREAMS

    def engine():
        s = engine_stats(TINY)
        return {
            "running": s.num_running,
            "waiting": s.num_waiting,
            "unfinished": s.num_unfinished,
            "kv": s.kv_cache_usage,
        }

    def router():
        h = httpx.get(f"{base_url}/healthz", headers=auth("interactive"), timeout=60).json()[
            "models"
        ][TINY]
        return {"in_flight": h["in_flight"], "queued": h["queued"]}

    def exported():
        return {
            **gauges("ray_llmserve_in_flight", "llmserve", TINY),
            **gauges("ray_llmserve_queue_depth", "llmserve", TINY),
        }

    engine_s, engine_after = wait_for(engine)
    router_s, router_after = wait_for(router)
    time.sleep(4)  # a fresh export first (see the test above)
    exported_s, exported_after = wait_for(exported, done=lambda f: bool(f) and all_zero(f))
    total_s = storm_s + engine_s + router_s + 4 + exported_s
    print(
        f"\n{NUM_TINY_STREAMS} streams on {TINY}, ended by the client in {storm_s:.1f} s: "
        f"{dict(endings)}; engine idle {engine_s:.1f} s later: {engine_after}; Router "
        f"(/healthz) {router_after}; exported gauges {exported_after} "
        f"{exported_s + 4:.1f} s after that"
    )
    assert not any(engine_after.values()), engine_after
    # Unaborted, 40 streams of 600 tokens keep the tiny engine (8 at once) busy for a minute
    # or more, and the clients' own requests wait behind them (30 s here with 300 tokens);
    # aborted, storm and drain take seconds (7 s here).
    assert storm_s + engine_s < TINY_STORM_WITHIN_S, (storm_s, engine_s)
    assert not any(router_after.values()), router_after
    assert exported_after and not any(exported_after.values()), exported_after
    reaped_s = reaped_after_s(app_args(model_dirs))
    assert total_s < reaped_s, f"drained in {total_s:.0f} s, no sooner than deadlines reap"
    r = httpx.post(
        f"{base_url}/v1/completions",
        timeout=CALL_TIMEOUT_S,
        json={"model": TINY, "prompt": "Hi", "max_tokens": 5, "ignore_eos": True},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
