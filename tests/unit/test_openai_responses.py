"""OpenAI response building from engine chunks: stream chunks, final response, model list."""

from __future__ import annotations

import pytest

from serve_app.generation import ChoiceDelta, GenerationChunk
from serve_app.openai_responses import ResponseBuilder, models_list



def delta(index, text, tokens=1, finish=None):
    return ChoiceDelta(index=index, text=text, num_tokens=tokens, finish_reason=finish)


def test_chat_stream_role_only_on_first_delta_per_choice():
    b = ResponseBuilder("chat", "chatcmpl-1", "m", n=2)
    c1 = b.add(GenerationChunk([delta(0, "Hel"), delta(1, "Yo")], num_prompt_tokens=5))
    c2 = b.add(GenerationChunk([delta(0, "lo"), delta(1, "!")], num_prompt_tokens=5))
    assert len(c1) == len(c2) == 1
    first, second = c1[0], c2[0]
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-1"
    assert [c["delta"] for c in first["choices"]] == [
        {"role": "assistant", "content": "Hel"}, {"role": "assistant", "content": "Yo"}]
    assert [c["delta"] for c in second["choices"]] == [{"content": "lo"}, {"content": "!"}]


def test_chat_stream_role_on_choice_first_seen_later():
    b = ResponseBuilder("chat", "id", "m", n=2)
    b.add(GenerationChunk([delta(0, "a")], 1))
    (chunk,) = b.add(GenerationChunk([delta(0, "b"), delta(1, "c")], 1))
    assert chunk["choices"][0]["delta"] == {"content": "b"}
    assert chunk["choices"][1]["delta"] == {"role": "assistant", "content": "c"}


@pytest.mark.parametrize(
    "engine_reason, shown", [("stop", "stop"), ("length", "length"), ("abort", None), (None, None)]
)
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_finish_reason_abort_is_never_shown(kind, engine_reason, shown):
    b = ResponseBuilder(kind, "id", "m", n=1)
    (chunk,) = b.add(GenerationChunk([delta(0, "x", finish=engine_reason)], 2))
    assert chunk["choices"][0]["finish_reason"] == shown
    assert b.response()["choices"][0]["finish_reason"] == shown


def test_chat_response_n2_and_usage_sums():
    b = ResponseBuilder("chat", "chatcmpl-9", "m", n=2)
    b.add(GenerationChunk([delta(0, "Par", 2), delta(1, "It", 1)], num_prompt_tokens=11))
    b.add(GenerationChunk([delta(0, "is", 1, "stop"), delta(1, " is", 3, "length")], 11))
    r = b.response()
    assert r["object"] == "chat.completion" and r["id"] == "chatcmpl-9" and r["model"] == "m"
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert [c["message"] for c in r["choices"]] == [
        {"role": "assistant", "content": "Paris"}, {"role": "assistant", "content": "It is"}]
    assert [c["finish_reason"] for c in r["choices"]] == ["stop", "length"]
    assert r["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    assert b.usage_chunk()["usage"] == r["usage"] and b.usage_chunk()["choices"] == []


def test_completion_stream_and_response_shapes():
    b = ResponseBuilder("completion", "cmpl-1", "m", n=1)
    (chunk,) = b.add(GenerationChunk([delta(0, " there", 2, "length")], 3))
    assert chunk["object"] == "text_completion"
    assert chunk["choices"] == [
        {"index": 0, "text": " there", "logprobs": None, "finish_reason": "length"}]
    r = b.response()
    assert r["object"] == "text_completion"
    assert r["choices"][0]["text"] == " there"
    assert r["usage"]["total_tokens"] == 5


def test_completion_echo_prefixes_prompt_once():
    b = ResponseBuilder("completion", "cmpl-1", "m", n=1)
    (c1,) = b.add(GenerationChunk([delta(0, " upon")], 2, prompt_text="Once"))
    (c2,) = b.add(GenerationChunk([delta(0, " a", finish="stop")], 2))
    assert c1["choices"][0]["text"] == "Once upon"
    assert c2["choices"][0]["text"] == " a"
    assert b.response()["choices"][0]["text"] == "Once upon a"
    assert b.usage()["completion_tokens"] == 2  # the echoed prompt is not counted


def test_completion_echo_applies_to_every_choice():
    b = ResponseBuilder("completion", "cmpl-1", "m", n=2)
    b.add(GenerationChunk([delta(0, " A"), delta(1, " B")], 1, prompt_text="P:"))
    b.add(GenerationChunk([delta(0, "a", finish="stop"), delta(1, "b", finish="stop")], 1))
    assert [c["text"] for c in b.response()["choices"]] == ["P: Aa", "P: Bb"]


def test_empty_chunk_makes_no_stream_chunk():
    assert ResponseBuilder("chat", "id", "m", 1).add(GenerationChunk([], 4)) == []


def test_models_list():
    assert models_list(["a", "b"], 123) == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": 123, "owned_by": "llmserve"},
            {"id": "b", "object": "model", "created": 123, "owned_by": "llmserve"},
        ],
    }
