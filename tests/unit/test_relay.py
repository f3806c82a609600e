"""The token path's units, without Ray: when a replica flushes, what crosses the hop, how a
reply is read back into chunks, and how an in-process ASGI app is called and left."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmserve.policies.stream_flush import FlushPolicy
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.protocol.replica_call import ReplicaRequest, ReplyEnd, ReplyHead, Usage
from llmserve.replica.engine.asgi_call import AsgiCall, reply_parts
from llmserve.router.request_path import SseChunks

# ------------------------------------------------------------------------------ FlushPolicy


@pytest.mark.parametrize(
    "interval_s, now_s, last_flush_s, hold_s",
    [
        (0.05, 10.0, None, 0.0),  # the first bytes go at once
        (0.05, 10.0, 9.99, 0.04),  # 10 ms after a flush: held 40 ms more
        (0.05, 10.0, 9.95, 0.0),  # an interval after the last flush: at once
        (0.05, 10.0, 9.0, 0.0),  # after a quiet spell: at once, nothing added
        (0.0, 10.0, 9.999, 0.0),  # interval 0: every write at once
    ],
)
def test_flush_holds_bytes_at_most_one_interval(interval_s, now_s, last_flush_s, hold_s):
    assert FlushPolicy(interval_s).hold_s(now_s, last_flush_s) == pytest.approx(hold_s)


# --------------------------------------------------------------------------------- SseChunks


def frame(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_sse_chunks_come_back_whole_however_the_bytes_are_cut():
    stream = (
        frame({"choices": [{"text": "a"}]})
        + frame({"choices": [{"text": "b"}]})
        + b"data: [DONE]\n\n"
    )
    for cut in range(1, len(stream)):
        reader = SseChunks()
        chunks = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [c["choices"][0]["text"] for c in chunks] == ["a", "b"], cut


@pytest.mark.parametrize(
    "tail",
    [
        b'event: error\ndata: {"error": {"message": "deadline", "code": "deadline_exceeded"}}\n\n',
        # vLLM's own mid-stream error: a data frame holding an error object.
        b'data: {"error": {"message": "engine died", "code": 500}}\n\n',
    ],
)
def test_an_error_in_the_stream_is_raised_to_handle_callers(tail):
    reader = SseChunks()
    assert len(reader.feed(frame({"choices": []}))) == 1
    with pytest.raises(OpenAIError) as e:
        reader.feed(tail)
    assert e.value.message in ("deadline", "engine died")


# ---------------------------------------------------------------------------- AsgiCall, relay


def streaming_app(num_tokens: int, every_s: float, seen: dict):
    """An ASGI app writing `num_tokens` SSE frames `every_s` apart, like an engine's server;
    it records whether it saw the client leave."""

    async def app(scope, receive, send):
        seen["request"] = (await receive())["body"]
        seen["path"] = scope["path"]

        async def listen():
            message = await receive()
            seen["disconnect"] = message["type"] == "http.disconnect"

        listener = asyncio.ensure_future(listen())
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"x-other", b"1")],
            }
        )
        try:
            for i in range(num_tokens):
                await send(
                    {
                        "type": "http.response.body",
                        "more_body": True,
                        "body": frame({"choices": [{"text": f"t{i}"}]}),
                    }
                )
                if listener.done():
                    seen["stopped_at"] = i
                    return
                await asyncio.sleep(every_s)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        finally:
            listener.cancel()

    return app


def request(body: bytes = b"{}") -> ReplicaRequest:
    return ReplicaRequest("r1", "/v1/completions", body, (("content-type", "application/json"),))


async def relay(app, interval_s: float, died: bool = False, num_tokens: int = 7) -> list:
    call = AsgiCall(app, request())
    usage = Usage(num_completion_tokens=num_tokens)
    parts = [
        p async for p in reply_parts(call, usage, FlushPolicy(interval_s), "rep-1", lambda: died)
    ]
    await call.close()
    return parts


def test_a_reply_crosses_as_head_coalesced_bytes_and_end():
    seen: dict = {}
    parts = asyncio.run(relay(streaming_app(40, 0.005, seen), interval_s=0.05))
    head, *middle, end = parts
    assert isinstance(head, ReplyHead) and isinstance(end, ReplyEnd)
    assert (head.status, head.headers, head.replica_id) == (
        200,
        (("content-type", "text/event-stream"),),
        "rep-1",
    )  # only what the Router needs
    assert head.body == frame({"choices": [{"text": "t0"}]})  # the first token, at once
    assert all(isinstance(p, bytes) for p in middle)
    # 40 writes 5 ms apart in 50 ms flushes: about 4 items, not 40.
    assert 2 <= len(middle) <= 8, len(middle)
    chunks = SseChunks().feed(head.body + b"".join(middle) + end.body)
    assert [c["choices"][0]["text"] for c in chunks] == [f"t{i}" for i in range(40)]
    assert end.usage.num_completion_tokens == 7 and not end.failed
    assert seen["request"] == b"{}" and seen["path"] == "/v1/completions"


def test_without_a_flush_interval_every_write_crosses_alone():
    parts = asyncio.run(relay(streaming_app(10, 0.005, {}), interval_s=0.0))
    assert len(parts) >= 10  # head, ~9 writes, end


async def relay_to_a_busy_hop(app, busy_s: float) -> list[tuple[float, object]]:
    """Each part with when it was handed over, the hop taking `busy_s` to send each one (the
    generator waits at its `yield` meanwhile, as it does while Serve writes the item)."""
    call = AsgiCall(app, request())
    loop = asyncio.get_running_loop()
    handed = []
    async for part in reply_parts(call, Usage(7), FlushPolicy(0.0), "rep-1", lambda: False):
        handed.append((loop.time(), part))
        await asyncio.sleep(busy_s)
    await call.close()
    return handed


@pytest.mark.parametrize(
    "busy_s, most_items, fewest_items",
    [
        (0.0, 42, 35),  # a free hop: each of the 40 writes (5 ms apart) goes on its own
        (0.03, 12, 5),  # a hop busy 30 ms an item: what was written meanwhile goes together
    ],
)
def test_without_a_window_writes_coalesce_only_while_the_hop_is_busy(
    busy_s, most_items, fewest_items
):
    handed = asyncio.run(relay_to_a_busy_hop(streaming_app(40, 0.005, {}), busy_s))
    assert fewest_items <= len(handed) <= most_items, len(handed)
    texts = SseChunks().feed(
        b"".join(p.body if isinstance(p, ReplyHead | ReplyEnd) else p for _, p in handed)
    )
    assert [c["choices"][0]["text"] for c in texts] == [f"t{i}" for i in range(40)]
    # Nothing waits longer than the hop's own busy time: no window on top.
    gaps = [later - earlier for (earlier, _), (later, _) in zip(handed, handed[1:])]
    assert max(gaps) < busy_s + 0.005 + 0.05


def test_closing_the_call_makes_the_app_see_the_client_leave():
    seen: dict = {}

    async def scenario():
        call = AsgiCall(streaming_app(1000, 0.005, seen), request())
        await asyncio.sleep(0.05)
        await call.close()

    asyncio.run(scenario())
    assert seen["disconnect"] is True
    assert seen["stopped_at"] < 100  # it stopped at once, not after its 1000 tokens


def one_reply_app(status: int, content_type: bytes, *bodies: bytes):
    """An ASGI app that answers every request with `status` and these body writes."""

    async def app(scope, receive, send):
        await receive()
        headers = [(b"content-type", content_type)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for body in bodies:
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def test_an_engine_dead_before_the_first_token_is_a_refusal_to_retry_elsewhere():
    failing_app = one_reply_app(500, b"application/json", b'{"error": {"code": 500}}')
    (head,) = asyncio.run(relay(failing_app, 0.05, died=True))
    assert head.status == 503 and head.code == "replica_unhealthy"
    # The same 500 from a live engine is the engine's answer, passed on as it is.
    head, end = asyncio.run(relay(failing_app, 0.05, died=False))
    assert head.status == 500 and head.code is None and isinstance(end, ReplyEnd)


def test_a_stream_whose_engine_died_before_its_first_token_is_retried_elsewhere():
    # vLLM's server sends a stream's 200 before asking the engine; an engine found dead then
    # makes the first frame an error (seen in CI: a request sent 17 ms after the engine's
    # process was killed, before Serve knew, answered its client an SSE error).
    dead_engine_stream = one_reply_app(
        200, b"text/event-stream", frame({"error": {"code": 500}}), b"data: [DONE]\n\n"
    )
    (head,) = asyncio.run(relay(dead_engine_stream, 0.05, died=True, num_tokens=0))
    assert head.status == 503 and head.code == "replica_unhealthy"
    # Once a token was generated the stream is the client's: relayed, ended as failed.
    head, *_, end = asyncio.run(relay(dead_engine_stream, 0.05, died=True, num_tokens=1))
    assert head.status == 200 and head.code is None and end.failed
    # A live engine's error frame is its answer.
    head, *_, end = asyncio.run(relay(dead_engine_stream, 0.05, died=False, num_tokens=0))
    assert head.status == 200 and head.code is None


def test_an_app_that_crashes_is_a_500_not_a_hang():
    async def broken_app(scope, receive, send):
        raise RuntimeError("bug")

    head, end = asyncio.run(relay(broken_app, 0.05))
    assert head.status == 500 and end.failed
