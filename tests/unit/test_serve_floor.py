"""bench/serve_floor.py, the relay benchmark's floor: it must refuse exactly the limited key and
stream exactly the tokens asked for, or its figures are not the same work as the platform's."""

import asyncio

from bench.serve_floor import REFUSAL, StaticRefusal, _stream


def _run(headers):
    sent, passed = [], []

    async def inner(scope, receive, send):
        passed.append(scope)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    asyncio.run(StaticRefusal(inner, b"sk-limited")(scope, None, send))
    return sent, passed


def test_the_limited_key_gets_a_static_429_and_other_keys_pass_through():
    sent, passed = _run([(b"authorization", b"Bearer sk-limited")])
    assert not passed
    assert sent[0]["status"] == 429 and sent[1]["body"] == REFUSAL
    assert (b"content-length", b"%d" % len(REFUSAL)) in sent[0]["headers"]
    sent, passed = _run([(b"authorization", b"Bearer sk-other")])
    assert not sent and len(passed) == 1


def test_the_stream_carries_every_token_once_then_done():
    async def collect():
        return [part async for part in _stream(rate=1000.0, max_tokens=7, flush_s=0.002)]

    parts = asyncio.run(collect())
    text = b"".join(parts)
    assert [text.count(b' tok%d"' % n) for n in range(7)] == [1] * 7
    assert b" tok7" not in text and parts[-1] == b"data: [DONE]\n\n"
    assert parts[0].count(b" tok") == 1  # the first token goes at once, alone
