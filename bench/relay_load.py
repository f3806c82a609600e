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


async def burst(
    port: int, n: int, key: str = LIMITED_KEY, body: dict | None = None
) -> list[tuple[float, bytes]]:
    """n POSTs of `body` to /v1/completions at once with `key`: each one's latency and whole
    response. Connections first, then every request in one go: the burst is the requests, not
    the handshakes (a flood's clients run on machines of their own)."""
    payload = json.dumps(body or {"model": "sim", "prompt": "hello", "max_tokens": 16}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json"
        b"\r\nAuthorization: Bearer " + key.encode() + b"\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload)
    )
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(n)))

    async def one(reader, writer) -> tuple[float, bytes]:
        t0 = time.monotonic()
        writer.write(head + payload)
        data = await reader.read()
        writer.close()
        return time.monotonic() - t0, data

    return await asyncio.gather(*(one(r, w) for r, w in conns))


def status_of(response: bytes) -> int:
    return int(response[9:12]) if response[:5] == b"HTTP/" else 0


async def _burst(port: int, n: int) -> tuple[list[float], dict[int, int]]:
    """n requests at once from the rate-limited tenant: each one's latency, and the statuses."""
    replies = await burst(port, n)
    statuses: dict[int, int] = {}
    for _, data in replies:
        status = status_of(data)
        statuses[status] = statuses.get(status, 0) + 1
    return sorted(latency for latency, _ in replies), statuses


async def _load(port: int, streams: int, max_tokens: int, end_s: float, counter: Counter):
    body = json.dumps(
        {"model": "sim", "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    ).encode()

    async def loop() -> None:
        while time.monotonic() < end_s:
            await _one("127.0.0.1", port, body, counter)

    await asyncio.gather(*(loop() for _ in range(streams)))
