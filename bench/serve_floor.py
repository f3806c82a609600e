"""bench.relay_cost's `serve-floor` system: Ray Serve's ingress with none of the platform's work.

One ingress deployment, named as the platform's (`Router`, so that it is measured as one), on the
same Ray environment (HAProxy in front, direct ingress, throughput-optimized Serve):
- a request with the rate-limited tenant's key is answered 429 by a pure ASGI middleware before
  FastAPI routes it, as the platform's EarlyRefusal answers it, but with no key lookup, token
  bucket, span, access-log line or metric;
- any other request gets a completion stream made in place, at the simulated engine's rate, its
  tokens written at most once per flush interval as the platform's replica sends them: no Ray hop,
  no engine, no admission.

So its figures are what Serve's ingress, uvicorn, Starlette and HAProxy cost on this host per
refusal and per streamed token: the floor under the platform's own Router figures.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from ray import serve

REFUSAL = b'{"error":{"message":"rate limited","type":"rate_limit_error","code":"rate_limit"}}'


class StaticRefusal:
    def __init__(self, app, key: bytes) -> None:
        self.app, self.authorization = app, b"Bearer " + key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (b"authorization", self.authorization) in scope["headers"]:
            headers = [
                (b"content-length", b"%d" % len(REFUSAL)),
                (b"content-type", b"application/json"),
            ]
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": REFUSAL})
            return
        await self.app(scope, receive, send)


def _frames(first: int, last: int) -> bytes:
    return b"".join(
        b'data: {"object":"text_completion","choices":[{"index":0,"text":" tok%d"}]}\n\n' % n
        for n in range(first, last)
    )


async def _stream(rate: float, max_tokens: int, flush_s: float):
    t0, sent = time.monotonic(), 0
    while sent < max_tokens:
        due = min(max_tokens, 1 + int((time.monotonic() - t0) * rate))
        if due > sent:
            yield _frames(sent, due)
            sent = due
        await asyncio.sleep(flush_s)
    yield b"data: [DONE]\n\n"


def floor_app(limited_key: str, rate: float, max_tokens: int, flush_s: float):
    app = FastAPI()
    app.add_middleware(StaticRefusal, key=limited_key.encode())

    @serve.deployment(name="Router", max_ongoing_requests=8192)
    @serve.ingress(app)
    class Floor:
        @app.post("/v1/completions")
        async def completions(self, request: Request) -> StreamingResponse:
            await request.body()
            return StreamingResponse(
                _stream(rate, max_tokens, flush_s), media_type="text/event-stream"
            )

    return Floor.bind()
