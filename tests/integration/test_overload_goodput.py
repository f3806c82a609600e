"""Goodput under open-loop overload, through the real Router and replica over a simulated engine
whose capacity is known by construction: at 3x that capacity the platform must still serve about
as many requests within their class's first-token promise as at 1x, refusing the rest at once
with 429/503 and Retry-After.

The simulated engine (4 slots, one token a step of 25 ms, 40-token answers: one request a second
a slot, 4 a second in all) stands in for the engine's throughput only; the bench's open-loop
scenario (`make bench`, (b)) measures the same on the real engine, where host speed sets the
capacity. What this guards is admission by the promise: a request that cannot start in time is
refused at admission instead of queued to miss. With the queue bounded by a deadline alone
(`max_queue_wait_s: 30`, no first-token objectives) goodput at 3x fell to 0.43/s against 3.46 at
1x. The simulated engine's service time is steady, so the queue's wait estimate suffices here;
what the adaptive in-flight limit adds (the real engine's prefill steps and frontend, which the
estimate cannot see) is tested at the gate (tests/unit/test_gate_in_flight_limit.py) and
measured by the bench.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from bench.client import Reply, send
from tests.integration.apps import CLIENT_TIMEOUT_S, SHIPPED_ADMISSION

APP, PREFIX, MODEL = "overload", "/overload", "sim-overload"
KEY = "sk-test-overload-standard-0001"
SLOTS, STEP_S, TOKENS = 4, 0.025, 40
CAPACITY_RPS = SLOTS / (STEP_S * TOKENS)  # 4 requests a second
PROMISE_S = SHIPPED_ADMISSION["ttft_objective_s_by_class"]["standard"]  # 2 s
WINDOW_S = 20.0
pytestmark = pytest.mark.timeout(600)


def overload_args(adaptive: bool = True) -> dict:
    return {
        "router": {"num_replicas": 1, "num_cpus": 0.25},
        "models": [
            {
                "name": MODEL,
                "source": "simulated",
                "simulation": {"step_s": STEP_S, "per_seq_step_s": 0},
                "engine": {"max_num_seqs": SLOTS},
                # The shipped ratio of Router slots to engine slots (48 for 32).
                "deployment": {"max_ongoing_requests": SLOTS * 3 // 2, "num_cpus": 0.25},
            }
        ],
        "admission": {**SHIPPED_ADMISSION, "adaptive_in_flight": adaptive},
        "tenants": [{"name": "overload-standard", "api_keys": [KEY], "priority": "standard"}],
    }


@pytest.fixture(scope="module")
def overload_url(serve_cluster):
    from ray import serve

    from llmserve.app import build_app

    serve.run(build_app(overload_args()), name=APP, route_prefix=PREFIX)
    yield serve_cluster + PREFIX
    serve.delete(APP)


async def open_loop(url: str, rate: float, seed: int) -> tuple[list[Reply], float]:
    """Poisson arrivals at `rate` for WINDOW_S; every reply, and the seconds from the first send
    to the last reply's end."""
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(rate)
    while t < WINDOW_S:
        arrivals.append(t)
        t += rng.expovariate(rate)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": TOKENS, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        t0 = time.monotonic()

        async def one(at_s: float) -> Reply:
            await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
            return await send(client, "/v1/completions", body, headers=headers, record_errors=False)

        replies = await asyncio.gather(*(one(a) for a in arrivals))
    span_s = max(r.end_s for r in replies) - min(r.start_s for r in replies)
    return replies, span_s


def p99_ms(values: list[float]) -> float | None:
    return round(1000 * sorted(values)[int(0.99 * (len(values) - 1))], 1) if values else None


def good(r: Reply) -> bool:
    return r.status == 200 and r.done and r.ttft_s is not None and r.ttft_s <= PROMISE_S


def test_goodput_at_3x_capacity_stays_near_1x(overload_url):
    # Warm the path (the Router's first requests pay one-off costs), then let it go idle.
    asyncio.run(open_loop(overload_url, CAPACITY_RPS / 4, seed=0))
    time.sleep(3)
    goodput = {}
    for x in (1, 3):
        replies, span_s = asyncio.run(open_loop(overload_url, x * CAPACITY_RPS, seed=x))
        statuses = sorted({r.status for r in replies})
        refused = [r for r in replies if r.status in (429, 503)]
        admitted = [r for r in replies if r.status == 200]
        goodput[x] = sum(map(good, replies)) / span_s
        print(
            f"{x}x ({x * CAPACITY_RPS:g}/s): {len(replies)} sent, goodput {goodput[x]:.2f}/s, "
            f"{len(refused)} refused, statuses {statuses}, admitted within the promise "
            f"{sum(map(good, admitted))}/{len(admitted)}, time to a refusal p99 "
            f"{p99_ms([r.latency_s for r in refused])} ms"
        )
        assert set(statuses) <= {200, 429, 503}, statuses
        assert all(r.retry_after for r in refused), "a refusal without Retry-After"
        assert all(r.done for r in admitted), "an admitted stream that did not finish"
        time.sleep(5)  # drained: the next level starts from idle
    # The engine serves ~4/s; at 1x most arrivals fit the promise.
    assert goodput[1] >= 0.6 * CAPACITY_RPS, goodput
    assert goodput[3] >= 0.8 * goodput[1], goodput
