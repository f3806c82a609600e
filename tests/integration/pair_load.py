"""The mixed load of the balance tests (test_routing.py): long and short completions
alternating every 80 ms, and how they spread over the replicas."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from bench.client import send
from tests.integration.apps import CALL_TIMEOUT_S


async def one_request(
    c: httpx.AsyncClient,
    max_tokens: int,
    i: int,
    model: str,
    timeout_s: float = CALL_TIMEOUT_S,
):
    body = {"model": model, "prompt": f"Request {i}", "max_tokens": max_tokens, "ignore_eos": True}
    r = await send(c, "/v1/completions", body, timeout=timeout_s)
    return {
        "status": type(r.exc).__name__ if r.exc else r.status,
        "replica": r.replica,
        "start": r.start_s,
        "end": r.end_s,
        "long": max_tokens > 4,
    }


def peak_concurrency(results: list[dict]) -> dict[str, int]:
    events = sorted(
        (t, d, r["replica"]) for r in results for t, d in ((r["start"], 1), (r["end"], -1))
    )
    current: Counter = Counter()
    peak: Counter = Counter()
    for _, d, replica in events:
        current[replica] += d
        peak[replica] = max(peak[replica], current[replica])
    return dict(peak)


async def mixed_load(url: str, model: str) -> list[dict]:
    """Long and short requests alternating, every 80 ms: round-robin stacks the long ones."""
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=64)) as c:
        tasks = []
        for i in range(32):
            max_tokens = 300 if i % 2 == 0 else 4
            tasks.append(asyncio.create_task(one_request(c, max_tokens, i, model)))
            await asyncio.sleep(0.08)
        return await asyncio.gather(*tasks)


def balance(url: str, model: str) -> tuple[dict[str, int], dict[str, int]]:
    """Peak concurrent requests and long requests per replica, after a warm-up round (which
    also lets the routing stats arrive)."""
    asyncio.run(mixed_load(url, model))
    results = asyncio.run(mixed_load(url, model))
    assert all(r["status"] == 200 for r in results), results
    return peak_concurrency(results), dict(Counter(r["replica"] for r in results if r["long"]))
