"""bench.relay_cost's client: streams over raw HTTP/1.1 (the cheapest client, so that the
machine's cores go to the serving path), and a refusal burst from a rate-limited tenant."""

from __future__ import annotations

import asyncio
import json
import time

KEY = "sk-bench-relay-0001"
LIMITED_KEY = "sk-bench-limited-0001"  # 1 request/s, a burst of 4: the refusal burst's tenant


class Counter:
    def __init__(self) -> None:
        self.tokens = 0
        self.requests = 0
        self.errors = 0
        self.ttft_s: list[float] = []


async def _one(host: str, port: int, body: bytes, counter: Counter) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.monotonic()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json"
        b"\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    tail, first = b"", True
    status = await reader.read(12)
    if not status.startswith(b"HTTP/1.1 200"):
        counter.errors += 1
    try:
        while data := await reader.read(65536):
            # " tokN" is the simulated engine's token text; count across read boundaries.
            n = (tail + data).count(b" tok") - tail.count(b" tok")
            if n and first:
                counter.ttft_s.append(time.monotonic() - t0)
                first = False
            counter.tokens += n
            tail = data[-3:]
    finally:
        writer.close()
    counter.requests += 1


async def _burst(port: int, n: int) -> tuple[list[float], dict[int, int]]:
    """n requests at once from the rate-limited tenant: each one's latency, and the statuses."""
    body = json.dumps({"model": "sim", "prompt": "hello", "max_tokens": 16}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json"
        b"\r\nAuthorization: Bearer " + LIMITED_KEY.encode() + b"\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    # Connections first, then every request in one go: the burst is the requests, not the
    # handshakes.
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(n)))
    statuses: dict[int, int] = {}

    async def one(reader, writer) -> float:
        t0 = time.monotonic()
        writer.write(head + body)
        data = await reader.read()
        writer.close()
        status = int(data[9:12]) if data[:5] == b"HTTP/" else 0
        statuses[status] = statuses.get(status, 0) + 1
        return time.monotonic() - t0

    latencies = await asyncio.gather(*(one(r, w) for r, w in conns))
    return sorted(latencies), statuses


async def _load(port: int, streams: int, max_tokens: int, end_s: float, counter: Counter):
    body = json.dumps(
        {"model": "sim", "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    ).encode()

    async def loop() -> None:
        while time.monotonic() < end_s:
            await _one("127.0.0.1", port, body, counter)

    await asyncio.gather(*(loop() for _ in range(streams)))
