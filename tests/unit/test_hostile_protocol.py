"""Request parsing under hostile input: what fuzzing the live app found, pinned in milliseconds.

Integers must fit in 64 bits (vLLM failed on bigger ones deep inside, which looked like a broken
replica), fields take the JSON type their schema gives (no "true" for true), an integer of
thousands of digits is a 400 (Python refuses to convert it: it was a 500), and the schema that
/openapi.json serves documents the bodies and every error status.
"""

from __future__ import annotations

import pytest

from serve_app.openapi_docs import openapi_extra
from serve_app.openai_protocol import (
    I64_MAX,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    parse_json_body,
    parse_request,
)


def completion(**kw):
    return {"model": "m", "prompt": "Hi", **kw}


def refused(kind: str, body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as e:
        parse_request(kind, body)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize(
    "field,value,param",
    [
        ("seed", 2**70, "seed"),
        ("top_k", 10**23, "top_k"),
        ("max_tokens", 2**64, "max_tokens"),
        ("n", 2**64, "n"),
        ("min_tokens", 2**63, "min_tokens"),
        ("best_of", 2**63, "best_of"),
        ("stop_token_ids", [1, 2**64], "stop_token_ids.1"),
        ("seed", -(2**63) - 1, "seed"),
    ],
)  # fmt: skip
def test_integers_beyond_64_bits_are_400s(field, value, param):
    assert refused("completion", completion(**{field: value})).param == param


def test_token_id_prompts_beyond_64_bits_are_400s():
    assert refused("completion", completion(prompt=[5, 2**64])).param == "prompt"
    assert refused("completion", completion(prompt=[[2**64]])).param == "prompt"


def test_64_bit_extremes_are_accepted():
    req = parse_request("completion", completion(seed=-(2**63), top_k=I64_MAX,
                                                 stop_token_ids=[I64_MAX]))  # fmt: skip
    assert (req.seed, req.top_k, req.stop_token_ids) == (-(2**63), I64_MAX, [I64_MAX])


@pytest.mark.parametrize(
    "field,value",
    [("stream", "true"), ("stream", 1), ("max_tokens", True), ("max_tokens", "5"),
     ("temperature", True), ("temperature", "0.5"), ("echo", "false"), ("seed", "7"),
     ("ignore_eos", "yes"), ("stream_options", {"include_usage": "on"}), ("n", 2.5)],
)  # fmt: skip
def test_fields_take_their_json_type_only(field, value):
    assert refused("completion", completion(**{field: value})).param.split(".")[0] == field


def test_integral_numbers_are_integers_as_json_schema_says():
    req = parse_request("completion", completion(max_tokens=16.0, n=2.0, prompt=[5.0, 6]))
    assert (req.max_tokens, req.n, req.prompt) == (16, 2, [5, 6])
    assert isinstance(req.max_tokens, int)
    req = parse_request("chat", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                 "temperature": 1, "logit_bias": {"5": 1}})  # fmt: skip
    assert req.temperature == 1.0 and req.logit_bias == {"5": 1.0}


def test_an_integer_of_thousands_of_digits_is_a_400():
    with pytest.raises(OpenAIError) as e:
        parse_json_body(b'{"model": "m", "seed": ' + b"9" * 5000 + b"}")
    assert e.value.status == 400


def test_deep_nesting_is_a_400():
    with pytest.raises(OpenAIError) as e:
        parse_json_body(b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert e.value.status == 400 and "deeply" in e.value.message


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_openapi_documents_the_body_and_every_error(model):
    extra = openapi_extra(model)
    schema = extra["requestBody"]["content"]["application/json"]["schema"]
    assert "$defs" not in str(schema) and "$ref" not in str(schema)  # stands alone
    assert {"model", "max_tokens", "stream"} <= set(schema["properties"])
    assert schema["properties"]["n"]["maximum"] == I64_MAX
    assert set(extra["responses"]) == {"200", "400", "401", "404", "413", "429", "503", "504"}
    error = extra["responses"]["429"]["content"]["application/json"]["schema"]
    assert error["properties"]["error"]["required"] == ["message", "type", "code"]
    assert set(openapi_extra(errors=(401,))["responses"]) == {"401"}
