"""Resuming a stream on another replica: which requests may (llmserve/policies/resume.py), and
what the replica makes of their frames (llmserve/replica/resumable.py)."""

from __future__ import annotations

import json

import pytest

from llmserve.policies.resume import Progress, continuation_body, resumable
from llmserve.protocol.replica_call import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    RESPONSES_PATH,
    ReplicaRequest,
    ReplyEnd,
    ReplyHead,
    Resume,
    StreamStart,
    Usage,
    reply_part,
)
from llmserve.replica.resumable import Continuation, TokenTap, TrackedReply

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
COMPLETION = {"model": "m", "prompt": "hi", "stream": True}


@pytest.mark.parametrize(
    "path, body, ok",
    [
        (CHAT_PATH, CHAT, True),
        (COMPLETIONS_PATH, COMPLETION, True),
        (CHAT_PATH, {**CHAT, "temperature": 0.7, "seed": 3, "max_tokens": 9, "timeout": 5}, True),
        (CHAT_PATH, {**CHAT, "stream_options": {"include_usage": True}}, True),
        (CHAT_PATH, {**CHAT, "n": 1, "logprobs": False, "tool_choice": "none"}, True),
        (CHAT_PATH, {**CHAT, "stream": False}, False),  # retried whole before its head
        (CHAT_PATH, {k: v for k, v in CHAT.items() if k != "stream"}, False),
        (RESPONSES_PATH, {"model": "m", "input": "hi", "stream": True}, False),
        (CHAT_PATH, {**CHAT, "n": 2}, False),
        (CHAT_PATH, {**CHAT, "logprobs": True, "top_logprobs": 2}, False),
        (CHAT_PATH, {**CHAT, "stop": ["\n"]}, False),  # held-back text would be lost
        (CHAT_PATH, {**CHAT, "tools": [{"type": "function"}]}, False),
        (CHAT_PATH, {**CHAT, "tool_choice": "required"}, False),
        (CHAT_PATH, {**CHAT, "response_format": {"type": "json_object"}}, False),
        (CHAT_PATH, {**CHAT, "structured_outputs": {"regex": "a+"}}, False),
        (CHAT_PATH, {**CHAT, "return_token_ids": True}, False),  # the client's own ids
        (CHAT_PATH, {**CHAT, "stream_options": {"continuous_usage_stats": True}}, False),
        (CHAT_PATH, {**CHAT, "a_field_from_a_later_vllm": 1}, False),
        (COMPLETIONS_PATH, {**COMPLETION, "echo": True}, False),
        (COMPLETIONS_PATH, {**COMPLETION, "prompt": ["a", "b"]}, False),
    ],
)
def test_which_streams_may_resume(path, body, ok):
    assert resumable(path, body) is ok


START = StreamStart("chatcmpl-1", 1700000000, (1, 2, 3))


def test_a_continuation_asks_for_the_rest_of_the_answer_from_where_it_broke():
    body = {
        **CHAT,
        "max_tokens": 10,
        "min_tokens": 4,
        "temperature": 0,
        "seed": 7,
        "priority": 5,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"x": 1},
        "return_token_ids": True,
    }
    out = continuation_body(body, Resume(START, (40, 41, 42)))
    assert out == {
        "model": "m",
        "prompt": [1, 2, 3, 40, 41, 42],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 7,
        "min_tokens": 1,
        "temperature": 0,
        "seed": 7,
        "priority": 5,
        "return_token_ids": True,
    }
    chat_field = continuation_body({**body, "max_completion_tokens": 10}, Resume(START, (9,)))
    assert chat_field["max_tokens"] == 9


def test_progress_resumes_at_most_max_resumes_times():
    p = Progress(max_resumes=2)
    assert not p.can_resume()  # no start seen: nothing to resume from
    p.start = START
    for raw in (b"5", b"", b"6,7"):  # as replicas send them
        p.add(raw)
    assert p.resume() == Resume(START, (5, 6, 7))
    assert p.can_resume()
    p.resume()
    assert not p.can_resume()
    assert not Progress(max_resumes=0, start=START).can_resume()


def chat_frame(content: str | None, ids: list[int], finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    choice["token_ids"] = ids
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 17, "model": "m"}
    return (
        b"data: " + json.dumps({**chunk, "choices": [choice]}).replace(" ", "").encode() + b"\n\n"
    )


ROLE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":17,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":[1,2,3],"prompt_text":null}\n\n'
)


def test_the_tap_takes_the_ids_out_of_the_bytes_and_holds_those_without_text_yet():
    tap = TokenTap()
    body, ids = tap.take(ROLE + chat_frame("Hi", [10]))
    assert tap.start == StreamStart("chatcmpl-1", 17, (1, 2, 3))
    assert ids == b"10"
    assert b"[1,2,3]" not in body and b'"prompt_token_ids":null' in body
    assert b'"token_ids":null' in body and b"[10]" not in body
    # A character over two tokens: the first brings no text; its id waits for the second's.
    # The empty chunk vLLM sends only for its ids is not the client's.
    body, ids = tap.take(chat_frame(None, [11]))
    assert (body, ids) == (b"", b"")
    body, ids = tap.take(chat_frame("é", [12]))
    assert ids == b"11,12" and b'"content":"\xc3\xa9"' in body.replace(b"\\u00e9", "é".encode())
    body, ids = tap.take(chat_frame("", [13], finish="length") + b"data: [DONE]\n\n")
    assert ids == b"13" and body.endswith(b"data: [DONE]\n\n")
    # Several chunks in one item (written while the previous one was on its way).
    body, ids = tap.take(chat_frame("a", [14]) + chat_frame("b", [15, 16]))
    assert ids == b"14,15,16" and body.count(b'"token_ids":null') == 2


def test_a_failed_reply_keeps_its_chunks_and_leaves_the_error_to_the_router():
    tap = TokenTap()
    tap.take(ROLE)
    error = b'data: {"error":{"message":"engine dead","code":500}}\n\ndata: [DONE]\n\n'
    body, ids = tap.take(chat_frame("a", [5]) + error, failed=True)
    assert ids == b"5" and body.startswith(b'data: {"id"') and b"error" not in body
    assert b"[DONE]" not in body


def test_without_prompt_ids_there_is_nothing_to_resume_from():
    tap = TokenTap()
    tap.take(b'data: {"error":{"message":"bad","code":400}}\n\n')
    assert tap.start is None


def completion_frame(text: str, ids: list[int], finish: str | None = None) -> bytes:
    chunk = {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 99,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_token_ids": [1, 2, 3, 40] if ids == [41] else None,
                "token_ids": ids,
            }
        ],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


USAGE = (
    b'data: {"id":"cmpl-9","object":"text_completion","created":99,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}\n\n'
)


def test_a_continuation_speaks_as_the_chat_stream_it_continues():
    c = Continuation(CHAT_PATH, StreamStart("chatcmpl-1", 17, (1, 2, 3)), num_sent=1)
    data = (
        completion_frame(" b", [41])
        + completion_frame("", [42])  # half a character
        + completion_frame("é", [43], finish="length")
        + USAGE
        + b"data: [DONE]\n\n"
    )
    body, ids = c.take(data)
    assert ids == b"41,42,43"
    frames = [json.loads(f[6:]) for f in body.split(b"\n\n") if f.startswith(b"data: {")]
    assert [f["id"] for f in frames] == ["chatcmpl-1"] * 3
    assert {f["object"] for f in frames} == {"chat.completion.chunk"}
    assert {f["created"] for f in frames} == {17}
    assert [f["choices"][0]["delta"] for f in frames[:2]] == [{"content": " b"}, {"content": "é"}]
    assert frames[1]["choices"][0]["finish_reason"] == "length"
    # The whole answer counted once: the prompt as the client sent it, every token generated.
    assert frames[2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert body.endswith(b"data: [DONE]\n\n")


def test_a_continuation_of_a_completions_stream_keeps_its_id_and_time():
    c = Continuation(COMPLETIONS_PATH, StreamStart("cmpl-1", 5, (1, 2, 3)), num_sent=1)
    body, ids = c.take(completion_frame(" b", [41]) + USAGE)
    first, usage = [json.loads(f[6:]) for f in body.split(b"\n\n") if f]
    assert ids == b"41"
    assert (first["id"], first["created"], first["choices"][0]["text"]) == ("cmpl-1", 5, " b")
    assert first["choices"][0]["token_ids"] is None
    assert first["choices"][0]["prompt_token_ids"] is None
    assert usage["usage"]["completion_tokens"] == 4


def test_a_resumed_request_asks_the_engine_for_the_continuation_and_counts_the_whole_answer():
    body = json.dumps({**CHAT, "max_tokens": 8, "return_token_ids": True}).encode()
    request = ReplicaRequest("r", CHAT_PATH, body, track_tokens=True, resume=Resume(START, (7, 8)))
    tracked = TrackedReply(request)
    sent = json.loads(tracked.engine_request.body)
    assert tracked.engine_request.path == COMPLETIONS_PATH
    assert (sent["prompt"], sent["max_tokens"]) == ([1, 2, 3, 7, 8], 6)
    sse = (("content-type", "text/event-stream"),)
    head = tracked.item(ReplyHead(200, sse, completion_frame(" b", [41]), "x"))
    assert head.stream_start == START and head.token_ids == b"41"
    assert tracked.item(b"") == reply_part(b"", b"")
    end = tracked.item(ReplyEnd(b"data: [DONE]\n\n", Usage(5, 3)))
    assert (end.usage.num_prompt_tokens, end.usage.num_completion_tokens) == (3, 5)
