"""What the platform reads from and adds to an OpenAI request, and its own error bodies.

The request itself belongs to vLLM: each replica validates and answers it with vLLM's own
OpenAI server, so every field `vllm serve` takes works here, with vLLM's answers and errors.
The Router reads only what admission needs (the model, how many tokens it may generate, its
deadline) and rewrites only what the platform decides (the tenant's max_tokens cap, its
priority), then forwards the body. A field of vLLM's with an odd value is forwarded as it came,
so vLLM answers it exactly as it would without the platform.

Pure: no Ray, no vLLM, no I/O.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from llmserve.protocol.replica_call import RESPONSES_PATH

# ---------------------------------------------------------------------------------------- errors

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class OpenAIError(Exception):
    """An error with its HTTP status, rendered as OpenAI's `{"error": {...}}` body.

    Raised to DeploymentHandle callers as is, so Python callers can `except OpenAIError`.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else str(self.status),
            }
        }

    def __reduce__(self):  # keep status and fields when pickled across Ray
        return (
            _rebuild_error,
            (self.status, self.message, self.param, self.code, self.type, self.headers),
        )

    @classmethod
    def from_reply(cls, status: int, body: bytes) -> OpenAIError:
        """The error a replica answered (vLLM's body), for DeploymentHandle callers."""
        try:
            err = json.loads(body)["error"]
            return cls(
                status,
                str(err.get("message", "")),
                param=err.get("param"),
                code=err.get("code"),
                type=err.get("type"),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(status, body.decode("utf-8", "replace")[:500])


def _rebuild_error(status, message, param, code, type_, headers) -> OpenAIError:
    return OpenAIError(status, message, param=param, code=code, type=type_, headers=headers)


# Every integer must fit in 64 bits: vLLM fails on a bigger one deep inside the engine (a 500
# from its own server, as from ours before this check), so the Router refuses it first.
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def _int64(literal: str) -> int:
    value = int(literal)
    if not I64_MIN <= value <= I64_MAX:
        raise OverflowError(
            f"the integer {literal[:40]}{'...' if len(literal) > 40 else ''} "
            "does not fit in 64 bits"
        )
    return value


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OpenAIError(400, f"request body is not valid UTF-8 ({e.reason})") from None
    try:
        body = json.loads(text, parse_int=_int64)
    except OverflowError as e:
        raise OpenAIError(400, str(e), code="invalid_value") from None
    except json.JSONDecodeError as e:
        raise OpenAIError(
            400, f"request body is not valid JSON: {e.msg} at position {e.pos}"
        ) from None
    except RecursionError:
        raise OpenAIError(400, "request body is nested too deeply") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise OpenAIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    return body


# -------------------------------------------------------------------------------------- requests

# The largest deadline a request may ask for, in seconds (a tenant's max_timeout_s caps it
# further); beyond this a number is a mistake, not a deadline.
MAX_TIMEOUT_S = 86_400.0
MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")
MAX_OUTPUT_TOKENS = "max_output_tokens"  # the Responses API's
# Fields vLLM's server uses before it checks their type, answering a 500 where a 400 is due
# (vLLM 0.32: `"structured_outputs": [1, 2]` -> "'list' object has no attribute 'get'"). The
# Router refuses them as a 400, the one place the platform answers otherwise than `vllm serve`
# (docs/api.md); tests/integration/test_api_fuzzing.py finds any new one.
OBJECT_FIELDS = ("structured_outputs",)


def _int_or_none(value: Any) -> int | None:
    """An integer the way vLLM would read it, or None when vLLM would refuse it anyway."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


@dataclass(frozen=True)
class RequestFields:
    """What admission reads from a request body."""

    model: str
    # The most tokens the request asks to generate per choice (max_completion_tokens, else
    # max_tokens), when it gives a usable one.
    max_tokens: int | None
    n: int
    timeout_s: float | None


def max_tokens_fields(path: str) -> tuple[str, ...]:
    """Where a request of `path` asks for its most tokens: the Responses API's own field, or
    chat's and completions' two (the first given wins)."""
    return (MAX_OUTPUT_TOKENS,) if path == RESPONSES_PATH else MAX_TOKENS_FIELDS


def read_fields(
    body: dict[str, Any], max_n: int, token_fields: tuple[str, ...] = MAX_TOKENS_FIELDS
) -> RequestFields:
    """The fields admission needs; raises a 400 for those that are the platform's own."""
    model = body.get("model")
    if model is None:
        raise OpenAIError(
            400, "'model' is a required property", param="model", code="invalid_value"
        )
    if not isinstance(model, str):
        raise OpenAIError(400, "model must be a string", param="model", code="invalid_value")
    max_tokens = None
    for name in token_fields:
        value = _int_or_none(body.get(name))
        if value is not None and value > 0:
            max_tokens = value
            break
    for name in OBJECT_FIELDS:
        if body.get(name) is not None and not isinstance(body[name], dict):
            raise OpenAIError(400, f"{name} must be an object", param=name, code="invalid_value")
    n = _int_or_none(body.get("n"))
    n = n if n is not None and n > 0 else 1
    if n > max_n:
        raise OpenAIError(400, f"n must be at most {max_n}", param="n", code="invalid_value")
    return RequestFields(model, max_tokens, n, _timeout(body.get("timeout")))


def check_responses_body(body: dict[str, Any]) -> None:
    """A 400 for what the platform does not serve of the Responses API: background mode (a
    response that runs on after its request ends would hold an engine slot outside admission,
    deadlines and the tenant's in-flight cap)."""
    if body.get("background"):
        raise OpenAIError(
            400,
            "background mode is not served: stream the response instead (stream: true)",
            param="background",
            code="unsupported_value",
        )


def response_not_found(response_id: str) -> OpenAIError:
    """vLLM's own 404 for a Responses API id it does not hold, word for word: also what another
    tenant's id gets."""
    return OpenAIError(
        404,
        f"Response with id '{response_id}' not found.",
        param="response_id",
        code=404,
        type="invalid_request_error",
    )


def _timeout(value: Any) -> float | None:
    """The request's own deadline (the platform's `timeout` extension), in seconds."""
    if value is None:
        return None
    bad = OpenAIError(
        400,
        f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]",
        param="timeout",
        code="invalid_value",
    )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    if isinstance(value, int) and not 0 < value <= MAX_TIMEOUT_S:  # before float(): no overflow
        raise bad
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise bad
    return seconds


def rewrite_body(
    body: dict[str, Any],
    *,
    default_max_tokens: int | None = None,
    max_tokens_cap: int | None = None,
    priority: int | None = None,
    token_fields: tuple[str, ...] = MAX_TOKENS_FIELDS,
    return_token_ids: bool = False,
) -> bytes:
    """The body a replica gets: the model's default max_tokens where the request gives none,
    the tenant's cap applied to both max_tokens fields (vLLM clips either to the context the
    prompt leaves), the tenant's priority instead of any the client sent, and the platform's
    `timeout` removed. `token_fields`: the request's max-tokens fields (`max_tokens_fields`);
    a default goes in the last. `return_token_ids`: asked of the engine for a stream the
    Router may resume (the replica takes them out of the client's bytes)."""
    out = dict(body)
    if return_token_ids:
        out["return_token_ids"] = True
    out.pop("timeout", None)
    out.pop("priority", None)  # the tenant's class decides, not the client
    if priority is not None:
        out["priority"] = priority
    asked = [n for n in token_fields if out.get(n) is not None]
    if max_tokens_cap is not None:
        for name in asked:
            value = _int_or_none(out[name])
            if value is not None:  # an odd value stays odd, for vLLM to refuse
                out[name] = min(value, max_tokens_cap)
    if not asked and (default_max_tokens is not None or max_tokens_cap is not None):
        limit = min(n for n in (default_max_tokens, max_tokens_cap) if n is not None)
        out[token_fields[-1]] = limit
    # ASCII escapes: a lone surrogate the client sent escaped stays valid JSON for vLLM.
    return json.dumps(out, separators=(",", ":")).encode()
