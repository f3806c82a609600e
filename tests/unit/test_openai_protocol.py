"""OpenAI request parsing and error bodies (pure, no Ray, no vLLM)."""

from __future__ import annotations

import json
import pickle

import pytest

from serve_app.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    parse_json_body,
    parse_request,
)

MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw) -> dict:
    return {"model": "m", "messages": MSGS, **kw}


def completion(**kw) -> dict:
    return {"model": "m", "prompt": "Once upon", **kw}


def parse_error(kind: str, body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as ei:
        parse_request(kind, body).to_generation("req-1", max_n=8)
    return ei.value


# ------------------------------------------------------------------------------ bad requests


@pytest.mark.parametrize(
    "kind, body, param",
    [
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"messages": MSGS}, "model"),
        ("chat", chat(messages=[]), "messages"),
        ("chat", chat(messages="hi"), "messages"),
        ("chat", chat(messages=[{"content": "x"}]), "messages.0.role"),
        ("chat", chat(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
        ("chat", chat(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
        ("chat", chat(model=5), "model"),
        ("chat", chat(max_tokens=-1), "max_tokens"),
        ("chat", chat(max_tokens=0), "max_tokens"),
        ("chat", chat(max_tokens="many"), "max_tokens"),
        ("chat", chat(max_completion_tokens=0), "max_completion_tokens"),
        ("chat", chat(temperature=2.5), "temperature"),
        ("chat", chat(temperature="hot"), "temperature"),
        ("chat", chat(top_p=0), "top_p"),
        ("chat", chat(n=0), "n"),
        ("chat", chat(stream="maybe"), "stream"),
        ("chat", chat(stream_options={"include_usage": "x"}), "stream_options.include_usage"),
        ("chat", chat(stop=5), "stop"),
        ("chat", chat(stop=""), "stop"),
        ("chat", chat(stop=["a"] * 17), "stop"),
        ("chat", chat(stop=["x" * 257]), "stop"),
        ("chat", chat(presence_penalty=3), "presence_penalty"),
        ("chat", chat(top_k=-2), "top_k"),
        ("chat", chat(min_p=1.5), "min_p"),
        ("chat", chat(repetition_penalty=0), "repetition_penalty"),
        ("chat", chat(stop_token_ids=["a"]), "stop_token_ids.0"),
        ("chat", chat(logit_bias={"1": "up"}), "logit_bias.1"),
        ("chat", chat(user="u" * 257), "user"),
        ("completion", {"model": "m"}, "prompt"),
        ("completion", completion(prompt=5), "prompt"),
        ("completion", completion(prompt=[1, "a"]), "prompt"),
        ("completion", completion(prompt={"text": "x"}), "prompt"),
        ("completion", completion(best_of=0), "best_of"),
        ("completion", completion(echo="loud"), "echo"),
    ],
)  # fmt: skip
def test_invalid_request_is_400_naming_the_param(kind, body, param):
    e = parse_error(kind, body)
    assert (e.status, e.param) == (400, param)
    assert e.body()["error"]["param"] == param
    assert e.body()["error"]["type"] == "invalid_request_error"
    assert param.split(".")[0] in e.message


def test_missing_messages_says_it_is_required():
    e = parse_error("chat", {"model": "m"})
    assert e.message == "'messages' is a required property"


@pytest.mark.parametrize(
    "body, param",
    [
        (chat(temperature=float("nan")), "temperature"),
        (chat(repetition_penalty=float("inf")), "repetition_penalty"),
        (chat(frequency_penalty=float("-inf")), "frequency_penalty"),
        (chat(logit_bias={"1": float("nan")}), "logit_bias.1"),
    ],
)
def test_nan_and_infinity_are_rejected(body, param):
    # Python's json.loads accepts NaN/Infinity; they must not reach the sampler.
    body = parse_json_body(json.dumps(body).encode())  # the HTTP path, with NaN in the text
    assert parse_error("chat", body).param == param


@pytest.mark.parametrize(
    "kind, body, param",
    [
        ("chat", chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        ("chat", chat(functions=[{"name": "f"}]), "functions"),
        ("chat", chat(tool_choice="auto"), "tool_choice"),
        ("chat", chat(logprobs=True), "logprobs"),
        ("chat", chat(top_logprobs=2), "top_logprobs"),
        ("chat", chat(audio={"voice": "x"}), "audio"),
        ("chat", chat(response_format={"type": "json_object"}), "response_format"),
        ("completion", completion(logprobs=3), "logprobs"),
        ("completion", completion(suffix="end"), "suffix"),
        ("completion", completion(n=1, best_of=3), "best_of"),
        ("completion", completion(prompt=["a", "b"]), "prompt"),
        ("completion", completion(prompt=[[1, 2], [3]]), "prompt"),
    ],
)  # fmt: skip
def test_unsupported_parameters_are_400_unsupported_parameter(kind, body, param):
    e = parse_error(kind, body)
    assert (e.status, e.param, e.code) == (400, param, "unsupported_parameter")
    assert e.body()["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    "body",
    [
        chat(tools=[]), chat(tools=None), chat(logprobs=False), chat(tool_choice=None),
        chat(response_format={"type": "text"}), chat(some_future_field={"x": 1}),
    ],
)  # fmt: skip
def test_empty_or_default_unsupported_fields_and_unknown_fields_are_accepted(body):
    gen = parse_request("chat", body).to_generation("r", max_n=8)
    assert gen.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("kind, make", [("chat", chat), ("completion", completion)])
def test_n_above_max_n_is_rejected(kind, make):
    with pytest.raises(OpenAIError) as ei:
        parse_request(kind, make(n=5)).to_generation("r", max_n=4)
    assert (ei.value.status, ei.value.param) == (400, "n")
    assert "4" in ei.value.message
    assert parse_request(kind, make(n=4)).to_generation("r", max_n=4).sampling["n"] == 4


@pytest.mark.parametrize("prompt", ["", [], [""], [[]]])
def test_empty_prompt_is_rejected(prompt):
    e = parse_error("completion", completion(prompt=prompt))
    assert (e.status, e.param) == (400, "prompt")


# ------------------------------------------------------------------------------ good requests


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("hello", "hello"),
        (["hello"], "hello"),  # a batch of one is unwrapped
        ([1, 2, 3], [1, 2, 3]),  # token ids
        ([[1, 2, 3]], [1, 2, 3]),
    ],
)
def test_completion_prompt_forms(prompt, expected):
    gen = parse_request("completion", completion(prompt=prompt, echo=True)).to_generation("r", 8)
    assert gen.prompt == expected
    assert gen.messages is None and gen.echo is True and gen.request_id == "r"


def test_best_of_equal_to_n_is_accepted():
    gen = parse_request("completion", completion(n=2, best_of=2)).to_generation("r", 8)
    assert gen.sampling["n"] == 2


def test_chat_messages_are_flattened_and_developer_becomes_system():
    body = chat(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ])  # fmt: skip
    gen = parse_request("chat", body).to_generation("r", 8)
    assert gen.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]
    assert gen.prompt is None


@pytest.mark.parametrize(
    "body, expected",
    [
        (chat(), None),
        (chat(max_tokens=7), 7),
        (chat(max_completion_tokens=9), 9),
        (chat(max_tokens=7, max_completion_tokens=9), 9),
    ],
)
def test_chat_max_tokens(body, expected):
    gen = parse_request("chat", body).to_generation("r", 8)
    assert gen.max_tokens == expected
    assert "max_tokens" not in gen.sampling  # kept apart: None means the model default


def test_sampling_kwargs_pass_vllm_extras_through():
    body = chat(
        temperature=0.5, top_p=0.9, n=2, stop=["\n"], presence_penalty=0.1,
        frequency_penalty=-0.2, seed=42, top_k=40, min_p=0.05, repetition_penalty=1.1,
        ignore_eos=True, min_tokens=3, stop_token_ids=[2, 3], skip_special_tokens=False,
        include_stop_str_in_output=True, logit_bias={"50256": -100, "7": 5},
        user="alice", stream=True,
    )  # fmt: skip
    sampling = parse_request("chat", body).to_generation("r", 8).sampling
    assert sampling == {
        "temperature": 0.5, "top_p": 0.9, "n": 2, "stop": ["\n"], "presence_penalty": 0.1,
        "frequency_penalty": -0.2, "seed": 42, "top_k": 40, "min_p": 0.05,
        "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 3, "stop_token_ids": [2, 3],
        "skip_special_tokens": False, "include_stop_str_in_output": True,
        "logit_bias": {50256: -100.0, 7: 5.0},
    }  # fmt: skip
    assert all(type(k) is int for k in sampling["logit_bias"])


def test_sampling_kwargs_leave_unset_fields_to_vllm():
    assert parse_request("chat", chat()).to_generation("r", 8).sampling == {"n": 1}


@pytest.mark.parametrize("key", ["abc", "1.5", ""])
def test_logit_bias_key_must_be_a_token_id(key):
    e = parse_error("chat", chat(logit_bias={key: 1}))
    assert (e.status, e.param) == (400, "logit_bias")


def test_include_usage():
    assert parse_request("chat", chat(stream_options={"include_usage": True})).include_usage
    assert not parse_request("chat", chat(stream_options={"include_usage": False})).include_usage
    assert not parse_request("chat", chat()).include_usage


def test_parse_request_returns_the_right_class():
    assert isinstance(parse_request("chat", chat()), ChatCompletionRequest)
    assert isinstance(parse_request("completion", completion()), CompletionRequest)


# ---------------------------------------------------------------------------- parse_json_body


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"\xff\xfe{}", "UTF-8"),
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"{'model': 'm'}", "not valid JSON"),
        (b"[]", "JSON object"),
        (b"5", "JSON object"),
        (b"null", "JSON object"),
        (b'"text"', "JSON object"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"a":' * 100_000, "nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)  # fmt: skip
def test_bad_json_body_is_400_not_a_crash(raw, words):
    with pytest.raises(OpenAIError) as ei:
        parse_json_body(raw)
    assert ei.value.status == 400
    assert words in ei.value.message
    assert ei.value.body()["error"]["type"] == "invalid_request_error"


def test_json_body_object_is_returned():
    assert parse_json_body('{"model": "m", "x": "é"}'.encode()) == {"model": "m", "x": "é"}


# ------------------------------------------------------------------------------- OpenAIError


@pytest.mark.parametrize(
    "status, type_",
    [(400, "invalid_request_error"), (404, "not_found_error"), (429, "rate_limit_error"),
     (503, "service_unavailable_error"), (504, "timeout_error"), (599, "server_error")],
)  # fmt: skip
def test_error_body_shape(status, type_):
    body = OpenAIError(status, "boom").body()
    assert body == {"error": {"message": "boom", "type": type_, "param": None,
                              "code": str(status)}}  # fmt: skip


def test_error_pickles_with_all_fields():
    headers = {"Retry-After": "3", "x-ratelimit-remaining-requests": "0"}
    e = OpenAIError(429, "slow down", param="p", code="rate_limit_exceeded", type="custom",
                    headers=dict(headers))  # fmt: skip
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is OpenAIError
    assert (e2.status, e2.message, e2.param, e2.code, e2.type) == (
        429, "slow down", "p", "rate_limit_exceeded", "custom")  # fmt: skip
    assert e2.headers == headers
    assert str(e2) == "slow down"
    assert e2.body() == e.body()


def test_error_default_type_survives_pickle():
    e2 = pickle.loads(pickle.dumps(OpenAIError(503, "busy", headers={"Retry-After": "1"})))
    assert e2.type == "service_unavailable_error" and e2.headers == {"Retry-After": "1"}
