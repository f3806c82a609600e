"""OpenAI-compatible request schemas and error bodies.

Pure: no Ray, no vLLM, no I/O. The Router parses with these models and turns a request into a
GenerationRequest for an LLMServer; serve_app/openai_responses.py turns the engine's chunks back
into OpenAI JSON, and serve_app/openapi_docs.py documents the routes.
Unknown request fields are accepted and ignored, as OpenAI and vLLM do, so newer SDKs keep working.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from serve_app.generation import GenerationRequest

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
        code: str | None = None,
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


def _rebuild_error(status, message, param, code, type_, headers) -> OpenAIError:
    return OpenAIError(status, message, param=param, code=code, type=type_, headers=headers)


# Parts of a pydantic error location that name a validator or a union member (`prompt.str`,
# `stop.list[str]`), not a field the client sent.
_NOT_A_FIELD_RE = re.compile(r"^(function-.*|str|int|float|bool|(list|dict)\[.*\])$")


def validation_error(e: ValidationError) -> OpenAIError:
    """The first pydantic error as a 400 naming the field, e.g. `messages.0.role`."""
    err = e.errors(include_url=False)[0]
    param = ".".join(str(p) for p in err["loc"] if not _NOT_A_FIELD_RE.match(str(p))) or None
    msg = err["msg"]
    if err["type"] == "missing":
        msg = f"'{param}' is a required property"
    elif param:
        msg = f"{param}: {msg}"
    return OpenAIError(400, msg, param=param, code="invalid_value")


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OpenAIError(400, f"request body is not valid UTF-8 ({e.reason})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise OpenAIError(400, f"request body is not valid JSON: {e.msg} at position {e.pos}")
    except RecursionError:
        raise OpenAIError(400, "request body is nested too deeply") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise OpenAIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    return body


# -------------------------------------------------------------------------------------- requests

# Every integer that reaches the engine must fit in 64 bits: vLLM fails on a bigger one deep in its
# request serialization, which looked like a broken replica (503 after a retry), not a 400.
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def _integral_float(value: Any) -> Any:
    # JSON has one number type: 16.0 is the integer 16 (JSON Schema agrees), 16.5 is not.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(ge: int = I64_MIN, le: int = I64_MAX) -> Any:
    """An integer field: a JSON number without a fraction, within [ge, le]."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral_float)]


Int64 = _int()


# Strict: a field gets the JSON type that the schema (served at /openapi.json) gives it, as with
# OpenAI; pydantic's lax mode took `"stream": "true"` or `"max_tokens": true` and made them valid.
STRICT = ConfigDict(strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class _Request(BaseModel):
    # allow_inf_nan=False: Python's json accepts NaN/Infinity, which would reach vLLM otherwise
    # (e.g. repetition_penalty=Infinity, logit_bias values NaN).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    model: str
    max_tokens: _int(1) | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: _int(1) = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: Int64 | None = None
    user: str | None = Field(default=None, max_length=256)
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling parameters, as its own OpenAI server accepts them.
    top_k: _int(-1) | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool | None = None
    min_tokens: _int(0) | None = None
    stop_token_ids: list[Int64] | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop):  # a field validator, so that the 400 names param "stop"
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > 16 or any(len(s) == 0 or len(s) > 256 for s in stops):
            raise ValueError("at most 16 non-empty strings of at most 256 characters")
        return stop

    def _unsupported(self, fields: tuple[str, ...]) -> None:
        extra = self.model_extra or {}
        for name in fields:
            value = extra.get(name)
            if value not in (None, False, [], {}):
                raise OpenAIError(
                    400, f"'{name}' is not supported by this server", param=name,
                    code="unsupported_parameter",
                )

    def sampling_kwargs(self) -> dict[str, Any]:
        """vllm.SamplingParams keyword arguments; unset fields keep vLLM's defaults."""
        names = (
            "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "seed",
            "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
            "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
        )  # fmt: skip
        kwargs = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        if self.logit_bias:
            try:
                kwargs["logit_bias"] = {int(k): float(v) for k, v in self.logit_bias.items()}
            except ValueError:
                raise OpenAIError(400, "logit_bias keys must be token ids", param="logit_bias")
        return kwargs

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: _int(1) | None = None

    def to_generation(self, request_id: str, max_n: int) -> GenerationRequest:
        self._unsupported(("tools", "functions", "tool_choice", "logprobs", "top_logprobs", "audio"))
        fmt = (self.model_extra or {}).get("response_format")
        if fmt not in (None, {"type": "text"}):
            raise OpenAIError(400, "only response_format {'type': 'text'} is supported",
                              param="response_format", code="unsupported_parameter")  # fmt: skip
        _check_n(self.n, max_n)
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]
        return GenerationRequest(
            request_id=request_id,
            messages=messages,
            sampling=self.sampling_kwargs(),
            max_tokens=self.max_completion_tokens or self.max_tokens,
        )


class CompletionRequest(_Request):
    prompt: str | list[Int64] | list[str] | list[list[Int64]]
    echo: bool = False
    best_of: _int(1) | None = None

    def to_generation(self, request_id: str, max_n: int) -> GenerationRequest:
        self._unsupported(("suffix", "logprobs"))
        _check_n(self.n, max_n)
        if self.best_of is not None and self.best_of != self.n:
            raise OpenAIError(400, "best_of must equal n (beam search is not offered)",
                              param="best_of", code="unsupported_parameter")  # fmt: skip
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise OpenAIError(400, "send one prompt per request (batched prompts are not "
                                  "supported)", param="prompt", code="unsupported_parameter")  # fmt: skip
            prompt = prompt[0]
        if isinstance(prompt, list) and not prompt or prompt == "":
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        return GenerationRequest(
            request_id=request_id,
            prompt=prompt,
            sampling=self.sampling_kwargs(),
            max_tokens=self.max_tokens,
            echo=self.echo,
        )


def _check_n(n: int, max_n: int) -> None:
    if n > max_n:
        raise OpenAIError(400, f"n must be at most {max_n}", param="n", code="invalid_value")


def parse_request(kind: Literal["chat", "completion"], body: dict[str, Any]) -> _Request:
    cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from None
