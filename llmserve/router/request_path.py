"""Small pieces of the Router's request path that need no Router state: the reply in flight, the
SSE frames the platform writes itself (a failure after the stream started), reading SSE back into
chunk dicts for DeploymentHandle callers.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from llmserve.policies.resume import Progress
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.protocol.replica_call import ReplicaRequest, ReplyEnd, ReplyHead
from llmserve.router.request_log import RequestTrail
from llmserve.router.shield import EDGE_HEADER
from llmserve.router.ticket import Ticket

DONE_FRAME = b"data: [DONE]\n\n"
EDGE_HEADER_BYTES = EDGE_HEADER.encode()
# Longer than this before the Router: a clock step, not a wait (the promises are seconds).
MAX_EDGE_WAIT_S = 60.0


def edge_wait_s(stamp: str | None, now_epoch_s: float) -> float:
    """Seconds a request spent between HAProxy and the Router (HAProxy's ingress, Serve's proxy,
    the hop, this event loop), from the stamp HAProxy sets (shield.EDGE_HEADER); 0 without one
    or for one that cannot be a wait (a clock step, garbage). Time the client waited, that its
    class's first-token promise counts: the gate counts it too."""
    try:
        waited_s = now_epoch_s - int(stamp or "") / 1e6
    except ValueError:
        return 0.0
    return waited_s if 0.0 < waited_s <= MAX_EDGE_WAIT_S else 0.0


def edge_wait_of(scope: dict[str, Any]) -> float | None:
    """edge_wait_s of an ASGI request, now; None where HAProxy did not stamp it."""
    stamp = next((v for k, v in scope["headers"] if k == EDGE_HEADER_BYTES), None)
    return None if stamp is None else edge_wait_s(stamp.decode("latin-1"), time.time())


@dataclass
class Resumable:
    """What resuming a tracked stream on another replica takes (llmserve/policies/resume.py)."""

    handle: DeploymentHandle
    request: ReplicaRequest
    session: str
    progress: Progress
    announce: bool = False  # http.debug_headers: say so in the stream (an SSE comment)


@dataclass
class OpenReply:
    """A forwarded request whose reply head has arrived (so errors surface as an HTTP status)."""

    head: ReplyHead
    rest: DeploymentResponseGenerator
    ticket: Ticket
    headers: dict[str, str]  # response headers of the platform's: rate limits, clamping notes
    trail: RequestTrail
    span: Span  # "stream": first bytes to the last, ended by the Router
    dispatched_s: float  # monotonic time the request left for the replica
    end: ReplyEnd | None = field(default=None)
    replica_failed: bool = False
    resumable: Resumable | None = None  # a tracked stream: may resume on another replica


def resumed_comment(replica_id: str, num_tokens: int, preempted: bool = False) -> bytes:
    """An SSE comment (clients skip it) saying where a stream resumed: `http.debug_headers`'
    counterpart of x-replica, which names the first replica only."""
    why = b" (preempted)" if preempted else b""
    return b": resumed on replica %s after %d tokens%s\n\n" % (
        replica_id.encode(),
        num_tokens,
        why,
    )


def sse_error(e: OpenAIError) -> bytes:
    """A failure after the stream started: an `error` event, then `[DONE]`, as clients expect.
    Frames end in a bare "\\n\\n", as OpenAI and vLLM send them: clients that split the stream
    on blank lines (vllm.benchmarks.serve among them) cannot parse "\\r\\n" frames."""
    return (
        b"event: error\ndata: "
        + json.dumps(e.body(), separators=(",", ":")).encode()
        + b"\n\n"
        + DONE_FRAME
    )


class SseChunks:
    """OpenAI stream chunks (dicts) out of SSE bytes that arrive in arbitrary pieces."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._pending += data
        *frames, self._pending = self._pending.split(b"\n\n")
        chunks = []
        for frame in frames:
            event, payload = "message", b""
            for line in frame.split(b"\n"):
                if line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    payload += line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            chunk = json.loads(payload)
            if event == "error" or (
                isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk
            ):
                err = chunk.get("error") or {}
                raise OpenAIError(
                    int(err.get("code") or 500) if str(err.get("code", "")).isdigit() else 500,
                    str(err.get("message", "stream failed")),
                    code=err.get("code"),
                    type=err.get("type"),
                )
            chunks.append(chunk)
        return chunks


def session_of(body: dict[str, Any]) -> str:
    """The session a request without `x-session-id` belongs to: OpenAI's `user` field."""
    user = body.get("user")
    return user[:128] if isinstance(user, str) else ""


def body_size(body: dict[str, Any]) -> int:
    """The size of a handle caller's body as JSON, for the prompt's token estimate."""
    return len(json.dumps(body))


async def until_disconnected(receive) -> None:
    """Returns once the HTTP client has gone (its body already read): a non-streaming reply is
    then abandoned, as vLLM's own server abandons it, instead of generated to its end."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work, receive):
    """`work`'s result, or CancelledError once the client has gone (the work is cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    return await task


def health_counts(snapshot: dict[str, dict[str, int]]) -> dict[str, int]:
    """/healthz for a caller without a key: how much, not which models."""
    return {
        "num_models": len(snapshot),
        "in_flight": sum(s["in_flight"] for s in snapshot.values()),
        "queued": sum(s["queued"] for s in snapshot.values()),
    }
