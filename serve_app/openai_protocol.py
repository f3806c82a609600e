"""OpenAI-compatible request schemas, response and SSE chunk builders, and error bodies.

Pure: no Ray, no vLLM, no I/O. The Router parses with these models, turns a request into a
GenerationRequest for an LLMServer, and turns GenerationChunks back into OpenAI JSON.
Unknown request fields are accepted and ignored, as OpenAI and vLLM do, so newer SDKs keep working.
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serve_app.generation import GenerationChunk, GenerationRequest

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
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    return body


# -------------------------------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    # allow_inf_nan=False: Python's json accepts NaN/Infinity, which would reach vLLM otherwise
    # (e.g. repetition_penalty=Infinity, logit_bias values NaN).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    user: str | None = Field(default=None, max_length=256)
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling parameters, as its own OpenAI server accepts them.
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = None
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
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(default=None, ge=1)

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
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)

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


# ------------------------------------------------------------------------------------- responses


class ResponseBuilder:
    """Accumulates one request's chunks into OpenAI stream chunks and a final response."""

    def __init__(self, kind: Literal["chat", "completion"], response_id: str, model: str, n: int):
        self.kind = kind
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.texts = [""] * n
        self.finish = [None] * n
        self.num_prompt_tokens = 0
        self.num_completion_tokens = 0
        self._role_sent = [False] * n
        self._echo = ""
        self._echo_sent = [False] * n

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def add(self, chunk: GenerationChunk) -> list[dict[str, Any]]:
        """Records a chunk; returns the stream chunks (as dicts) it makes."""
        self.num_prompt_tokens = chunk.num_prompt_tokens
        if chunk.prompt_text is not None:
            self._echo = chunk.prompt_text
        out = []
        for c in chunk.choices:
            self.num_completion_tokens += c.num_tokens
            text = c.text
            if self._echo and not self._echo_sent[c.index]:  # every choice starts with the prompt
                text = self._echo + text
                self._echo_sent[c.index] = True
            self.texts[c.index] += text
            reason = _finish_reason(c.finish_reason)
            if reason:
                self.finish[c.index] = reason
            out.append(self._stream_choice(c.index, text, reason))
        return [self._chunk(out)] if out else []

    def _stream_choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        if self.kind == "completion":
            return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        delta: dict[str, Any] = {"content": text}
        if not self._role_sent[index]:
            delta = {"role": "assistant", "content": text}
            self._role_sent[index] = True
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}

    def _chunk(self, choices: list[dict[str, Any]], usage: bool = False) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage:
            chunk["usage"] = self.usage()
        return chunk

    def usage_chunk(self) -> dict[str, Any]:
        return self._chunk([], usage=True)

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_completion_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_completion_tokens,
        }

    def response(self) -> dict[str, Any]:
        if self.kind == "chat":
            choices = [
                {"index": i, "message": {"role": "assistant", "content": t},
                 "logprobs": None, "finish_reason": self.finish[i]}
                for i, t in enumerate(self.texts)
            ]  # fmt: skip
        else:
            choices = [
                {"index": i, "text": t, "logprobs": None, "finish_reason": self.finish[i]}
                for i, t in enumerate(self.texts)
            ]
        return {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }


def _finish_reason(engine_reason: str | None) -> str | None:
    # vLLM says "abort" when it stopped a request itself; to a client that is an error, reported
    # separately, so it never shows as a finish_reason.
    return engine_reason if engine_reason in ("stop", "length") else None


def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "llmserve"}
            for n in names
        ],
    }
