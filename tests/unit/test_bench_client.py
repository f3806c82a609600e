"""bench/client.py's reading of OpenAI replies, against canned ones (httpx.MockTransport, no
server): streams with usage, a stream that fails after it started, whole JSON answers and
errors, a transport error."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.client import send


def _sse(*events: str) -> bytes:
    return "".join(f"{e}\n\n" for e in events).encode()


def _data(obj: dict) -> str:
    return "data: " + json.dumps(obj)


def _client(status: int, content: bytes, **headers: str) -> httpx.AsyncClient:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content, headers=headers)

    return httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(reply))


CHAT_STREAM = _sse(
    _data({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    _data({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Par"}}]}),
    _data({"id": "c1", "choices": [{"index": 0, "delta": {"content": "is"}}]}),
    _data({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
    _data(
        {
            "id": "c1",
            "choices": [],
            "usage": {
                "prompt_tokens": 700,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 512},
            },
        }
    ),
    "data: [DONE]",
)


async def test_a_streamed_chat_reply_with_usage():
    headers = {"x-replica": "r1", "x-route": "reason=prefix", "content-type": "text/event-stream"}
    async with _client(200, CHAT_STREAM, **headers) as c:
        body = {"model": "m", "messages": [], "stream": True}
        r = await send(c, "/v1/chat/completions", body)
    assert (r.status, r.text, r.finish_reason, r.done, r.sse_error, r.exc) == (
        200,
        "Paris",
        "length",
        True,
        None,
        None,
    )
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (700, 2, 512)
    assert (r.replica, r.route, r.retry_after) == ("r1", "reason=prefix", None)
    # The role-only chunk is the first chunk, not the first token.
    assert 0 <= r.first_chunk_s <= r.ttft_s <= r.latency_s


async def test_a_stream_that_fails_after_it_started():
    error = {"error": {"message": "deadline exceeded", "type": "timeout", "code": "deadline"}}
    stream = _sse(
        _data({"id": "x", "choices": [{"index": 0, "text": " one"}]}),
        "event: error\n" + _data(error),
        "data: [DONE]",
    )
    async with _client(200, stream) as c:
        r = await send(c, "/v1/completions", {"model": "m", "prompt": "p", "stream": True})
    assert (r.status, r.text, r.done, r.finish_reason) == (200, " one", True, None)
    assert json.loads(r.sse_error) == error
    assert r.first_chunk_s == pytest.approx(r.ttft_s, abs=0.01)


async def test_vllms_error_chunk_is_a_stream_error_too():
    error = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
    async with _client(200, _sse(_data(error))) as c:
        r = await send(c, "/v1/completions", {"model": "m", "prompt": "p", "stream": True})
    assert json.loads(r.sse_error) == error
    assert (r.done, r.first_chunk_s, r.ttft_s) == (False, None, None)


async def test_a_whole_json_answer():
    answer = {
        "id": "cmpl-1",
        "choices": [{"index": 0, "text": "Paris.", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": None},
    }
    async with _client(200, json.dumps(answer).encode(), **{"x-replica": "r2"}) as c:
        r = await send(c, "/v1/completions", {"model": "m", "prompt": "p"})
    assert (r.status, r.text, r.finish_reason, r.replica) == (200, "Paris.", "stop", "r2")
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (5, 3, 0)
    assert json.loads(r.body) == answer
    assert (r.first_chunk_s, r.ttft_s, r.done) == (None, None, False)


async def test_a_whole_chat_answer():
    answer = {"choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "stop"}]}
    async with _client(200, json.dumps(answer).encode()) as c:
        r = await send(c, "/v1/chat/completions", {"model": "m", "messages": []})
    assert (r.text, r.completion_tokens) == ("Hi", 0)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_answer_with_retry_after(stream):
    error = {"error": {"message": "over the rate", "type": "rate_limit", "code": "rate_limit"}}
    async with _client(429, json.dumps(error).encode(), **{"Retry-After": "2"}) as c:
        r = await send(c, "/v1/completions", {"model": "m", "prompt": "p", "stream": stream})
    assert (r.status, r.retry_after, r.text, r.done, r.exc) == (429, "2", "", False, None)
    assert json.loads(r.body) == error


async def test_a_transport_error_is_recorded_or_raised():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    transport = httpx.MockTransport(refuse)
    async with httpx.AsyncClient(base_url="http://test", transport=transport) as c:
        r = await send(c, "/v1/completions", {"model": "m", "prompt": "p", "stream": True})
        assert (r.status, type(r.exc)) == (0, httpx.ConnectError)
        assert r.end_s >= r.start_s
        with pytest.raises(httpx.ConnectError):
            await send(c, "/v1/completions", {"model": "m", "prompt": "p"}, record_errors=False)
