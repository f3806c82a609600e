"""Other Ray apps call the Router and the LLMServers through DeploymentHandles, streaming too."""

from __future__ import annotations

import json

import pytest
from ray import serve

from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.protocol.replica_call import ReplicaRequest, ReplyEnd, ReplyHead
from tests.integration.apps import CALL_TIMEOUT_S, DEFAULT
from tests.integration.conftest import llm_handle

PARIS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_router_handle_chat_and_stream(serve_app):
    router = serve.get_app_handle("llmserve")
    body = {"model": DEFAULT, "messages": PARIS, "temperature": 0, "max_tokens": 20}
    resp = router.chat_completions.remote(body).result(timeout_s=300)
    assert "Paris" in resp["choices"][0]["message"]["content"]

    chunks = list(
        router.options(stream=True).stream_chat_completions.remote(
            {**body, "stream_options": {"include_usage": True}}
        )
    )
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == resp["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == resp["usage"]["completion_tokens"]


def test_router_handle_responses_and_their_events(serve_app):
    router = serve.get_app_handle("llmserve")
    body = {"model": DEFAULT, "input": "What is the capital of France?", "temperature": 0}
    first = router.responses.remote({**body, "max_output_tokens": 12}).result(timeout_s=300)
    events = list(
        router.options(stream=True).stream_responses.remote(
            {**body, "max_output_tokens": 12, "previous_response_id": first["id"]}
        )
    )
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    done = events[-1]["response"]
    assert done["previous_response_id"] == first["id"]
    assert done["usage"]["input_tokens"] > first["usage"]["input_tokens"]  # the first turn in it


def test_router_handle_raises_openai_errors(serve_app):
    router = serve.get_app_handle("llmserve")
    with pytest.raises(OpenAIError) as info:
        router.chat_completions.remote({"model": "nope", "messages": PARIS}).result(
            timeout_s=CALL_TIMEOUT_S
        )
    assert info.value.status == 404


def _forward(body: dict, request_id: str) -> list:
    req = ReplicaRequest(
        request_id,
        "/v1/chat/completions",
        json.dumps(body).encode(),
        (("content-type", "application/json"),),
    )
    return list(llm_handle(DEFAULT).options(stream=True).generate.remote(req))


def test_llm_server_handle_answers_with_vllms_own_server(serve_app):
    head, *middle, end = _forward(
        {"model": DEFAULT, "messages": PARIS, "temperature": 0, "max_tokens": 16, "stream": True},
        "handle-test-1",
    )
    assert isinstance(head, ReplyHead) and isinstance(end, ReplyEnd)
    assert head.status == 200 and head.is_stream
    assert all(isinstance(p, bytes) for p in middle)
    sse = (head.body + b"".join(middle) + end.body).decode()
    assert "Paris" in sse and sse.endswith("data: [DONE]\n\n")
    assert end.usage.num_completion_tokens > 0 and end.usage.num_prompt_tokens > 0
    head, end = _forward(
        {"model": DEFAULT, "messages": PARIS, "max_tokens": "many"}, "handle-test-2"
    )
    assert head.status == 400 and json.loads(head.body)["error"]["code"] == 400
