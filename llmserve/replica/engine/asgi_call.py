"""One forwarded request answered by an in-process ASGI app (the engine's OpenAI server), its
response read as the app writes it.

This is how a replica reuses vLLM's own HTTP layer without a socket: the request goes through
vLLM's FastAPI app exactly as `vllm serve` would route it (validation, error bodies, streaming),
and what the app sends is collected here. The app sees a client that stays connected until
`close()`, which it reads as a disconnect: vLLM then aborts the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from llmserve.policies.stream_flush import FlushPolicy
from llmserve.protocol.replica_call import ReplicaRequest, ReplyEnd, ReplyHead, Usage

logger = logging.getLogger("ray.serve")
ASGIApp = Callable[
    [dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]
]
# Headers of the app's response that the Router passes on (the rest are the app's own business).
KEPT_RESPONSE_HEADERS = frozenset({"content-type"})
JSON_HEADERS = (("content-type", "application/json"),)
CLOSE_GRACE_S = 2.0  # for the app to notice a disconnect before it is cancelled


class AsgiCall:
    def __init__(self, app: ASGIApp, request: ReplicaRequest) -> None:
        self.status: int | None = None
        self.headers: tuple[tuple[str, str], ...] = ()
        self.complete = False  # the app sent its last body message, or ended
        self.error: BaseException | None = None
        self._request = request
        self._chunks: list[bytes] = []
        self._ready = asyncio.Event()  # new bytes, the head, or the end
        self.ended = asyncio.Event()  # the last body message, or the app's end
        self._disconnected = asyncio.Event()
        self._body_read = False
        self._task = asyncio.get_running_loop().create_task(self._run(app))

    def _scope(self) -> dict[str, Any]:
        r = self._request
        return {
            "type": "http",
            # As uvicorn (under `vllm serve`) says: the app then listens for the disconnect
            # itself (vLLM's with_cancellation, Starlette's StreamingResponse) and aborts.
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": r.path,
            "raw_path": r.path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in r.headers]
            + [(b"content-length", str(len(r.body)).encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "state": {},
        }

    async def _run(self, app: ASGIApp) -> None:
        try:
            await app(self._scope(), self._receive, self._send)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the app's own handlers answer errors; this is a bug
            logger.exception("the engine's app failed on %s", self._request.request_id)
            self.error = e
        finally:
            self._end()

    async def _receive(self) -> dict[str, Any]:
        if not self._body_read:
            self._body_read = True
            return {"type": "http.request", "body": self._request.body, "more_body": False}
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = tuple(
                (k.decode("latin-1").lower(), v.decode("latin-1"))
                for k, v in message.get("headers", ())
                if k.decode("latin-1").lower() in KEPT_RESPONSE_HEADERS
            )
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if body:
                self._chunks.append(body)
            if not message.get("more_body", False):
                self._end()
                return
        else:
            return
        self._ready.set()

    def _end(self) -> None:
        self.complete = True
        self.ended.set()
        self._ready.set()

    async def wait(self) -> None:
        """Until something new is there: the head, bytes, or the end."""
        if not self._ready.is_set():
            await self._ready.wait()
        self._ready.clear()

    @property
    def has_data(self) -> bool:
        return bool(self._chunks)

    def take(self) -> bytes:
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        return data

    async def close(self) -> None:
        """The client is gone (or the reply is done): the app sees a disconnect and stops. It
        is cancelled only if it does not: cancelling first would stop vLLM's disconnect
        listener before it aborts the engine request, leaving that to run to its end."""
        self._disconnected.set()
        if self._task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_GRACE_S)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            self._task.cancel()
            raise
        except Exception:  # the app's failure was logged in _run
            pass
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def refusal(replica_id: str, why: str) -> ReplyHead:
    """A 503 the Router retries elsewhere: this replica took no work."""
    body = json.dumps(
        {
            "error": {
                "message": f"replica unavailable: {why}",
                "type": "service_unavailable_error",
                "param": None,
                "code": "replica_unhealthy",
            }
        }
    ).encode()
    return ReplyHead(503, JSON_HEADERS, body, replica_id, code="replica_unhealthy")


async def reply_parts(
    call: AsgiCall,
    usage: Usage,
    flush: FlushPolicy,
    replica_id: str,
    engine_died: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[ReplyHead | bytes | ReplyEnd]:
    """The reply as it crosses the hop: `ReplyHead` with the first bytes (the response head and
    the first token, at once), then the bytes written meanwhile at most once per flush
    interval, then `ReplyEnd` with the rest and the usage (at once: the last tokens are never
    held). An engine that died before the first token makes the head a refusal the Router
    retries elsewhere; `engine_died()` says whether it has."""
    while call.status is None and not call.complete:
        await call.wait()
    if call.status is None:  # the app ended without answering (a bug: it logged why)
        yield ReplyHead(
            500,
            JSON_HEADERS,
            b'{"error": {"message": "internal server error", '
            b'"type": "InternalServerError", "param": null, "code": 500}}',
            replica_id,
        )
        yield ReplyEnd(b"", usage, failed=True)
        return
    while not call.has_data and not call.complete:
        await call.wait()
    if (call.status >= 500 or usage.num_completion_tokens == 0) and engine_died():
        # Nothing was sent, so the Router may retry it on another replica. A stream's status
        # is 200 before the engine is asked: one the engine failed before its first token
        # opens with vLLM's error frame, not a 500.
        yield refusal(replica_id, "engine died")
        return
    yield ReplyHead(call.status, call.headers, call.take(), replica_id)
    last_flush = clock()
    while not call.complete:
        await call.wait()
        hold = flush.hold_s(clock(), last_flush)
        if hold and not call.complete:
            try:  # the reply's end goes at once: no hold on the last tokens
                await asyncio.wait_for(call.ended.wait(), hold)
            except TimeoutError:
                pass
        if call.complete:
            break
        last_flush = clock()
        yield call.take()
    failed = call.error is not None or engine_died()
    yield ReplyEnd(call.take(), usage, failed=failed)
