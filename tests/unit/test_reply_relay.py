"""The Router's reply relay (llmserve/router/reply_relay.py) against a fake replica handle: what a
request whose deadline passed before its reply head answers; a stream whose replica dies."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest
from ray.serve.exceptions import RequestCancelledError

from llmserve.policies.resume import Progress
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.protocol.replica_call import (
    ReplicaRequest,
    ReplyEnd,
    ReplyHead,
    Resume,
    StreamStart,
    Usage,
    reply_part,
)
from llmserve.router.reply_relay import ReplyRelay
from llmserve.router.request_log import RequestTrail
from llmserve.router.request_path import OpenReply, Resumable
from llmserve.router.ticket import Ticket
from tests.unit.gate_helpers import MODEL, make_gate

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


class LostCancelStream(FakeStream):
    """A reply that never comes and a cancel that does not reach it (Serve's cancel is best
    effort)."""

    async def __anext__(self):
        await asyncio.Event().wait()


def test_a_reply_head_that_never_comes_is_a_504_soon_after_the_deadline(monkeypatch):
    from llmserve.router import reply_relay

    grace_s = 0.05
    real = reply_relay.head_wait_s
    monkeypatch.setattr(reply_relay, "head_wait_s", lambda now, dl: real(now, dl, grace_s))
    stream = LostCancelStream([])
    relay = ReplyRelay(SimpleNamespace(num_rejected=Counter(), clock=lambda: 100.0))
    request = ReplicaRequest("r1", "/v1/chat/completions", b"{}")

    async def go():
        return await relay.dispatch(FakeHandle(stream), request, ticket(100.1), "")

    loop = asyncio.new_event_loop()
    t0 = loop.time()
    with pytest.raises(OpenAIError) as e:
        loop.run_until_complete(go())
    waited_s = loop.time() - t0
    loop.close()
    assert (e.value.status, e.value.code) == (504, "deadline_exceeded"), e.value
    assert 0.1 <= waited_s < 1.0, waited_s  # the deadline, then the grace; not forever
    assert stream.cancelled
    assert relay.gate.num_rejected[("m", "deadline")] == 1


# -- a tracked stream whose replica or engine dies mid-stream resumes on another ------------

START = StreamStart("chatcmpl-1", 17, (1, 2))


class Died(Exception):
    """The replica's actor died: Ray raises at the next item."""


class RaisingStream(FakeStream):
    async def __anext__(self):
        item = await super().__anext__()
        if isinstance(item, Exception):
            raise item
        return item


class Replicas:
    """A handle whose every call is answered by the next of `streams`; keeps the requests."""

    def __init__(self, *streams: FakeStream) -> None:
        self.streams = list(streams)
        self.requests: list[ReplicaRequest] = []

        def remote(request):
            self.requests.append(request)
            return self.streams.pop(0)

        self.generate = SimpleNamespace(remote=remote)

    def options(self, **_):
        return self


def tracked_reply(first: list, max_resumes: int, *rest: FakeStream):
    gate = SimpleNamespace(
        num_rejected=Counter(), clock=lambda: 1.0, finish=finish, preemptible=lambda *a: None
    )
    relay = ReplyRelay(gate)
    head = ReplyHead(200, SSE, b"a", "r1", stream_start=START, token_ids=b"10")
    request = ReplicaRequest("q", "/v1/chat/completions", b"{}", track_tokens=True)
    replicas = Replicas(*rest)
    progress = Progress(max_resumes, START, [b"10"])
    reply = OpenReply(
        head,
        RaisingStream(first),
        ticket(deadline_s=100.0),
        {},
        RequestTrail(SimpleNamespace(record=lambda o: None), "q", "", "chat"),
        SimpleNamespace(
            add_event=lambda *a, **k: None, set_attribute=lambda *a: None, end=lambda: None
        ),
        0.0,
        resumable=Resumable(replicas, request, "", progress),
    )
    return relay, reply, replicas


finished: list[int] = []


def finish(ticket, tokens):
    finished.append(tokens)


async def relayed(relay, reply) -> bytes:
    return b"".join([part async for part in relay.parts(reply)])


def second_replica(*items) -> RaisingStream:
    head = ReplyHead(200, SSE, b"c", "r2", stream_start=START, token_ids=b"12")
    return RaisingStream([head, *items])


@pytest.mark.parametrize(
    "fault",
    [Died("actor died"), ReplyEnd(b"", failed=True)],
    ids=["replica died", "engine died"],
)
def test_a_stream_whose_replica_dies_resumes_where_its_client_is(fault):
    end = ReplyEnd(b"d[DONE]", Usage(2, 4), token_ids=b"13")
    relay, reply, replicas = tracked_reply(
        [reply_part(b"b", b"11"), fault], 2, second_replica(reply_part(b"", b""), end)
    )
    assert asyncio.run(relayed(relay, reply)) == b"abcd[DONE]"
    (resumed,) = replicas.requests
    assert resumed.resume == Resume(START, (10, 11))
    assert resumed.avoid_replica_id == "r1"  # not the replica that failed
    assert reply.trail.num_resumes == 1 and reply.end is end
    assert finished[-1] == 6  # the tenant pays the whole answer once, as the replica counted


def test_a_stream_gives_up_after_its_resumes():
    relay, reply, replicas = tracked_reply(
        [reply_part(b"b", b"11"), Died("1")], 1, second_replica(Died("2"))
    )
    with pytest.raises(OpenAIError) as e:
        asyncio.run(relayed(relay, reply))
    assert e.value.status == 503 and len(replicas.requests) == 1
    assert finished[-1] == 0  # a replica's failure costs the tenant nothing


def test_an_untracked_stream_ends_with_the_error_as_before():
    relay, reply, replicas = tracked_reply([b"b", Died("1")], 0, second_replica())
    with pytest.raises(OpenAIError) as e:
        asyncio.run(relayed(relay, reply))
    assert e.value.status == 503 and replicas.requests == []
    failed_end = ReplyEnd(b"data: error", failed=True)
    relay, reply, replicas = tracked_reply([failed_end], 0, second_replica())
    assert asyncio.run(relayed(relay, reply)) == b"adata: error"
    assert reply.end is failed_end and replicas.requests == []


# -- a tracked batch stream preempted for an interactive request goes on afterwards ---------


class RunningStream(FakeStream):
    """Items, then waits until cancelled (a long answer in progress), as Serve's stream does."""

    def __init__(self, items: list) -> None:
        super().__init__(items)
        self._cancelled = asyncio.Event()

    async def __anext__(self):
        if self.items:
            return self.items.pop(0)
        await self._cancelled.wait()
        raise RequestCancelledError("cancelled")

    def cancel(self) -> None:
        super().cancel()
        self._cancelled.set()


def test_a_preempted_stream_gives_its_slot_and_goes_on_where_it_stopped():
    tenants = (
        {"name": "b", "api_keys": ["sk-batch-0001"], "priority": "batch"},
        {"name": "i", "api_keys": ["sk-interactive-0001"], "priority": "interactive"},
    )
    gate, by_name, _ = make_gate(
        *tenants,
        max_ongoing_requests=1,
        max_num_seqs=1,
        ttft_objective_s_by_class={"interactive": 1},
    )
    relay = ReplyRelay(gate)

    async def go():
        batch = await gate.admit(by_name["b"], MODEL, 10, 60)
        head = ReplyHead(200, SSE, b"a", "r1", stream_start=START, token_ids=b"10")
        replicas = Replicas(second_replica(ReplyEnd(b"d[DONE]", Usage(2, 3), token_ids=b"13")))
        reply = OpenReply(
            head,
            RunningStream([reply_part(b"b", b"11")]),
            batch,
            {},
            RequestTrail(SimpleNamespace(record=lambda o: None), "q", "", "chat"),
            SimpleNamespace(
                add_event=lambda *a, **k: None, set_attribute=lambda *a: None, end=lambda: None
            ),
            0.0,
            resumable=Resumable(
                replicas,
                ReplicaRequest("q", "/v1/chat/completions", b"{}"),
                "",
                Progress(2, START, [b"10"]),
            ),
        )
        relay.allow_preemption(reply)
        out = asyncio.ensure_future(relayed(relay, reply))
        await asyncio.sleep(0.01)  # "ab" relayed; the answer goes on
        # The only slot is batch's: without preemption this waits for the whole answer.
        interactive = await asyncio.wait_for(gate.admit(by_name["i"], MODEL, 10, 60), 1)
        await asyncio.sleep(0.01)
        assert not out.done() and replicas.requests == []  # waits for its slot back
        gate.finish(interactive, 10)
        return await out, replicas, reply

    body, replicas, reply = asyncio.run(go())
    assert body == b"abcd[DONE]"
    (resumed,) = replicas.requests
    assert resumed.resume == Resume(START, (10, 11))
    assert resumed.avoid_replica_id is None  # no replica failed: any may go on with it
    assert reply.trail.num_preemptions == 1 and reply.trail.num_resumes == 0
    assert gate.snapshot()[MODEL] == {"capacity": 1, "in_flight": 0, "queued": 0}
