"""What the Router reads from and adds to a request body, and its error bodies (pure).

The request itself is vLLM's (each replica answers with vLLM's own server): the Router reads only
the model, the max_tokens it reserves for, n and its own `timeout`, and rewrites only the
tenant's cap and priority. A field of vLLM's with an odd value is left as it came, for vLLM to
answer as `vllm serve` would.
"""

from __future__ import annotations

import json
import pickle

import pytest

from llmserve.protocol.openai_protocol import (
    MAX_TIMEOUT_S,
    OpenAIError,
    RequestFields,
    check_responses_body,
    max_tokens_fields,
    parse_json_body,
    read_fields,
    rewrite_body,
)
from llmserve.protocol.replica_call import CHAT_PATH, RESPONSES_PATH

MSGS = [{"role": "user", "content": "hi"}]


def fields(**body) -> RequestFields:
    return read_fields({"model": "m", "messages": MSGS, **body}, max_n=8)


def refusal(body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as e:
        read_fields(body, max_n=8)
    assert e.value.status == 400
    return e.value


# ------------------------------------------------------------------------------- read_fields


@pytest.mark.parametrize(
    "body, expected",
    [
        ({}, RequestFields("m", None, 1, None)),
        ({"max_tokens": 16}, RequestFields("m", 16, 1, None)),
        ({"max_tokens": 16.0}, RequestFields("m", 16, 1, None)),  # JSON: 16.0 is 16
        ({"max_completion_tokens": 8, "max_tokens": 16}, RequestFields("m", 8, 1, None)),
        ({"n": 3, "timeout": 2.5}, RequestFields("m", None, 3, 2.5)),
        ({"timeout": 60}, RequestFields("m", None, 1, 60.0)),
        # vLLM's to refuse: read as "not given", forwarded untouched.
        ({"max_tokens": "many"}, RequestFields("m", None, 1, None)),
        ({"max_tokens": True}, RequestFields("m", None, 1, None)),
        ({"max_tokens": -5}, RequestFields("m", None, 1, None)),
        ({"n": "x"}, RequestFields("m", None, 1, None)),
        ({"n": 0}, RequestFields("m", None, 1, None)),
        ({"structured_outputs": {"choice": ["a", "b"]}}, RequestFields("m", None, 1, None)),
        ({"structured_outputs": None}, RequestFields("m", None, 1, None)),
    ],
)
def test_fields_admission_reads(body, expected):
    assert fields(**body) == expected


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": MSGS}, "model"),
        ({"model": 42, "messages": MSGS}, "model"),
        ({"model": None, "messages": MSGS}, "model"),
        ({"model": "m", "n": 9}, "n"),
        ({"model": "m", "timeout": 0}, "timeout"),
        ({"model": "m", "timeout": -1}, "timeout"),
        ({"model": "m", "timeout": "5"}, "timeout"),
        ({"model": "m", "timeout": True}, "timeout"),
        ({"model": "m", "timeout": float("nan")}, "timeout"),
        ({"model": "m", "timeout": float("inf")}, "timeout"),
        ({"model": "m", "timeout": MAX_TIMEOUT_S + 1}, "timeout"),
        # 400 digits: float() of it overflowed into a 500 once.
        ({"model": "m", "timeout": int("9" * 400)}, "timeout"),
        # vLLM 0.32 answers these with a 500 ("'list' object has no attribute 'get'").
        ({"model": "m", "structured_outputs": [1, 2]}, "structured_outputs"),
        ({"model": "m", "structured_outputs": "json"}, "structured_outputs"),
        ({"model": "m", "structured_outputs": 12}, "structured_outputs"),
    ],
)
def test_platform_fields_with_odd_values_are_400s(body, param):
    e = refusal(body)
    assert e.param == param and e.body()["error"]["code"] == "invalid_value"


# ------------------------------------------------------------------------------ rewrite_body


def rewritten(
    body: dict, cap: int | None = None, priority: int | None = None, default: int | None = None
) -> dict:
    return json.loads(
        rewrite_body(body, default_max_tokens=default, max_tokens_cap=cap, priority=priority)
    )


@pytest.mark.parametrize(
    "body, cap, expected",
    [
        ({"model": "m"}, None, {"model": "m"}),
        ({"model": "m"}, 16, {"model": "m", "max_tokens": 16}),
        ({"model": "m", "max_tokens": 8}, 16, {"model": "m", "max_tokens": 8}),
        ({"model": "m", "max_tokens": 99}, 16, {"model": "m", "max_tokens": 16}),
        (
            {"model": "m", "max_completion_tokens": 99},
            16,
            {"model": "m", "max_completion_tokens": 16},
        ),
        (
            {"model": "m", "max_completion_tokens": 99, "max_tokens": 99},
            16,
            {"model": "m", "max_completion_tokens": 16, "max_tokens": 16},
        ),
        # Odd values stay odd, for vLLM's 400.
        ({"model": "m", "max_tokens": "x"}, 16, {"model": "m", "max_tokens": "x"}),
        ({"model": "m", "max_tokens": -3}, 16, {"model": "m", "max_tokens": -3}),
    ],
)
def test_the_tenant_cap_applies_to_both_max_tokens_fields(body, cap, expected):
    assert rewritten(body, cap) == expected


@pytest.mark.parametrize(
    "body, default, cap, expected",
    [
        ({}, 256, None, 256),  # the model's default where the request gives none
        ({}, 256, 16, 16),  # a tenant's cap below it
        ({"max_tokens": 500}, 256, None, 500),  # a default, not a cap
    ],
)
def test_the_models_default_max_tokens(body, default, cap, expected):
    assert rewritten({"model": "m", **body}, cap, default=default)["max_tokens"] == expected


def test_priority_is_the_tenants_and_timeout_is_not_forwarded():
    body = {"model": "m", "priority": -100, "timeout": 5, "logprobs": True}
    assert rewritten(body, priority=2) == {"model": "m", "priority": 2, "logprobs": True}
    # A model scheduled first-come first-served gets no priority field at all.
    assert rewritten(body) == {"model": "m", "logprobs": True}


def test_every_other_field_is_forwarded_as_it_came():
    body = {
        "model": "m",
        "messages": MSGS,
        "tools": [{"type": "function"}],
        "top_k": 3,
        "response_format": {"type": "json_object"},
        "text": "\u00e9\ud800",
    }
    assert rewritten(body) == body


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
)
def test_bad_json_body_is_400_not_a_crash(raw, words):
    with pytest.raises(OpenAIError) as ei:
        parse_json_body(raw)
    assert ei.value.status == 400
    assert words in ei.value.message
    assert ei.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("literal", [str(2**63), str(-(2**63) - 1), "1" + "0" * 23])
def test_integers_beyond_64_bits_are_400s_before_vllm_sees_them(literal):
    with pytest.raises(OpenAIError) as e:
        parse_json_body(b'{"model": "m", "top_k": ' + literal.encode() + b"}")
    assert e.value.status == 400 and "64 bits" in e.value.message


def test_64_bit_extremes_are_accepted():
    body = parse_json_body(f'{{"seed": {2**63 - 1}, "x": [{-(2**63)}]}}'.encode())
    assert body == {"seed": 2**63 - 1, "x": [-(2**63)]}


def test_json_body_object_is_returned():
    assert parse_json_body('{"model": "m", "x": "é"}'.encode()) == {"model": "m", "x": "é"}


# ------------------------------------------------------------------------------- OpenAIError


@pytest.mark.parametrize(
    "status, type_",
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (503, "service_unavailable_error"),
        (504, "timeout_error"),
        (599, "server_error"),
    ],
)
def test_error_body_shape(status, type_):
    body = OpenAIError(status, "boom").body()
    assert body == {"error": {"message": "boom", "type": type_, "param": None, "code": str(status)}}


def test_error_pickles_with_all_fields():
    headers = {"Retry-After": "3", "x-ratelimit-remaining-requests": "0"}
    e = OpenAIError(
        429,
        "slow down",
        param="p",
        code="rate_limit_exceeded",
        type="custom",
        headers=dict(headers),
    )
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is OpenAIError
    assert (e2.status, e2.message, e2.param, e2.code, e2.type) == (
        429,
        "slow down",
        "p",
        "rate_limit_exceeded",
        "custom",
    )
    assert e2.headers == headers
    assert str(e2) == "slow down"
    assert e2.body() == e.body()


def test_error_default_type_survives_pickle():
    e2 = pickle.loads(pickle.dumps(OpenAIError(503, "busy", headers={"Retry-After": "1"})))
    assert e2.type == "service_unavailable_error" and e2.headers == {"Retry-After": "1"}


# ------------------------------------------------------------------------- the Responses API


@pytest.mark.parametrize(
    "body, default, cap, expected",
    [
        ({"max_output_tokens": 99}, 256, 16, {"max_output_tokens": 16}),  # the tenant's cap
        ({"max_output_tokens": 8}, 256, 16, {"max_output_tokens": 8}),
        ({}, 256, None, {"max_output_tokens": 256}),  # the model's default, in its own field
        # chat's fields are not the Responses API's: vLLM ignores them, so does admission
        ({"max_tokens": 99}, None, 16, {"max_tokens": 99, "max_output_tokens": 16}),
    ],
)
def test_responses_are_admitted_by_max_output_tokens(body, default, cap, expected):
    fields_ = max_tokens_fields(RESPONSES_PATH)
    body = {"model": "m", "input": "hi", **body}
    out = json.loads(
        rewrite_body(body, default_max_tokens=default, max_tokens_cap=cap, token_fields=fields_)
    )
    assert out == {"model": "m", "input": "hi", **expected}
    assert read_fields(body, 8, fields_).max_tokens == body.get("max_output_tokens")
    assert max_tokens_fields(CHAT_PATH) == ("max_completion_tokens", "max_tokens")


def test_background_responses_are_refused():
    check_responses_body({"model": "m", "background": False})
    with pytest.raises(OpenAIError) as e:
        check_responses_body({"model": "m", "background": True})
    assert (e.value.status, e.value.param) == (400, "background")
