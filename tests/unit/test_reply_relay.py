"""The Router's reply relay (llmserve/router/reply_relay.py) against a fake replica handle: what a
request whose deadline passed before its reply head answers."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.protocol.replica_call import ReplicaRequest, ReplyEnd, ReplyHead
from llmserve.router.admission_gate import Ticket
from llmserve.router.reply_relay import ReplyRelay

SSE = (("content-type", "text/event-stream"),)
JSON = (("content-type", "application/json"),)


class FakeStream:
    """A replica's reply as Serve hands it over: items, then StopAsyncIteration."""

    def __init__(self, items: list) -> None:
        self.items = list(items)
        self.cancelled = False

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.generate = SimpleNamespace(remote=lambda request: self.stream)

    def options(self, **_):
        return self


def ticket(deadline_s: float) -> Ticket:
    return Ticket("e1", "t", "m", num_reserved_tokens=10, deadline_s=deadline_s, rate_headers={})


def dispatch(head: ReplyHead, deadline_s: float, now_s: float = 100.0):
    stream = FakeStream([head, ReplyEnd(b"data: [DONE]\n\n")])
    relay = ReplyRelay(SimpleNamespace(num_rejected=Counter(), clock=lambda: now_s))
    request = ReplicaRequest("r1", "/v1/completions", b"{}")

    async def go():
        return await relay.dispatch(FakeHandle(stream), request, ticket(deadline_s), "")

    return relay, stream, go


def test_a_stream_past_its_deadline_at_its_head_is_a_504_and_its_engine_request_ends():
    relay, stream, go = dispatch(ReplyHead(200, SSE, b"data: {}\n\n"), deadline_s=99.0)
    with pytest.raises(OpenAIError) as e:
        asyncio.run(go())
    assert (e.value.status, e.value.code) == (504, "deadline_exceeded")
    assert stream.cancelled  # the replica aborts the engine request
    assert relay.gate.num_rejected[("m", "deadline")] == 1


def test_a_stream_within_its_deadline_is_relayed():
    relay, stream, go = dispatch(ReplyHead(200, SSE, b"data: {}\n\n"), deadline_s=101.0)
    _, head = asyncio.run(go())
    assert head.status == 200 and not stream.cancelled
    assert not relay.gate.num_rejected


def test_a_whole_answer_that_came_just_late_is_still_given():
    # Not streamed, the head is the answer: finished work is not thrown away for a few ms.
    relay, stream, go = dispatch(ReplyHead(200, JSON, b'{"id": "x"}'), deadline_s=99.0)
    _, head = asyncio.run(go())
    assert head.status == 200 and not stream.cancelled
