"""Other Ray apps call the Router and the LLMServers through DeploymentHandles, streaming too."""

from __future__ import annotations

import pytest
from ray import serve

from serve_app.generation import GenerationChunk, GenerationError, GenerationRequest
from serve_app.openai_protocol import OpenAIError
from tests.integration.conftest import CALL_TIMEOUT_S, DEFAULT, llm_handle

PARIS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_router_handle_chat_and_stream(serve_app):
    router = serve.get_app_handle("llmserve")
    body = {"model": DEFAULT, "messages": PARIS, "temperature": 0, "max_tokens": 20}
    resp = router.chat_completions.remote(body).result(timeout_s=300)
    assert "Paris" in resp["choices"][0]["message"]["content"]

    chunks = list(router.options(stream=True).stream_chat_completions.remote(
        {**body, "stream_options": {"include_usage": True}}))  # fmt: skip
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == resp["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == resp["usage"]["completion_tokens"]


def test_router_handle_raises_openai_errors(serve_app):
    router = serve.get_app_handle("llmserve")
    with pytest.raises(OpenAIError) as info:
        router.chat_completions.remote({"model": "nope", "messages": PARIS}).result(
            timeout_s=CALL_TIMEOUT_S)  # fmt: skip
    assert info.value.status == 404


def test_llm_server_handle_streams_generation_chunks(serve_app):
    req = GenerationRequest("handle-test-1", messages=PARIS, sampling={"temperature": 0},
                            max_tokens=16)  # fmt: skip
    items = list(llm_handle(DEFAULT).options(stream=True).generate.remote(req))
    assert all(isinstance(i, GenerationChunk) for i in items) and len(items) > 1
    assert "Paris" in "".join(c.text for i in items for c in i.choices)
    bad = GenerationRequest("handle-test-2", prompt="x", max_tokens=10**6)
    (err,) = list(llm_handle(DEFAULT).options(stream=True).generate.remote(bad))
    assert isinstance(err, GenerationError) and err.status == 400
