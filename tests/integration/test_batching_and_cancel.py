"""Continuous batching through the whole stack, and aborts when a client goes away."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.integration.conftest import DEFAULT, engine_stats

NUM_TOKENS = 64


async def _one(client: httpx.AsyncClient, i: int) -> int:
    r = await client.post("/v1/completions", json={
        "model": DEFAULT, "prompt": f"Story number {i}:", "max_tokens": NUM_TOKENS,
        "temperature": 0.8, "seed": i, "ignore_eos": True,
    })  # fmt: skip
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


async def _timed(base_url: str, concurrency: int) -> float:
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        t0 = time.monotonic()
        tokens = await asyncio.gather(*(_one(client, i) for i in range(concurrency)))
        elapsed = time.monotonic() - t0
    assert tokens == [NUM_TOKENS] * concurrency
    return elapsed


def test_sixteen_concurrent_requests_batch(base_url):
    asyncio.run(_timed(base_url, 1))  # warm-up
    t1 = asyncio.run(_timed(base_url, 1))
    t16 = asyncio.run(_timed(base_url, 16))
    ratio = t16 / t1
    print(f"\none request {t1:.2f} s, 16 concurrent {t16:.2f} s: {ratio:.1f}x the time for "
          f"16x the work ({16 / ratio:.1f}x throughput)")  # fmt: skip
    assert ratio < 6, "16 concurrent requests should take far less than 16x one request"


def test_disconnect_mid_stream_aborts_engine_request(base_url, http):
    body = {"model": DEFAULT, "prompt": "Count to a thousand:", "max_tokens": 1500,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.Client(base_url=base_url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(10)]
            assert any(line.startswith("data: {") for line in got)
            mid = engine_stats(DEFAULT)
            assert mid.num_running == 1 and mid.num_unfinished == 1
        # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and engine_stats(DEFAULT).num_unfinished:
        time.sleep(0.2)
    stats = engine_stats(DEFAULT)
    print(f"\nafter disconnect: {stats}")
    assert stats.num_unfinished == 0 and stats.num_running == 0
    assert stats.kv_cache_usage == 0.0
    r = http.post("/v1/completions", json={"model": DEFAULT, "prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
