"""Router: the ingress deployment. OpenAI-compatible HTTP API, dispatch by model name.

The HTTP routes and the Python handle methods share one path (`_open_stream`), so a Ray app calling
`chat_completions` through a DeploymentHandle gets the same validation and errors as an HTTP client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.config import AppConfig
from serve_app.generation import GenerationError
from serve_app.openai_protocol import (
    OpenAIError,
    ResponseBuilder,
    models_list,
    parse_json_body,
    parse_request,
)
from serve_app.tracing import RequestIdentityMiddleware

logger = logging.getLogger("ray.serve")
Kind = Literal["chat", "completion"]
ID_PREFIX = {"chat": "chatcmpl", "completion": "cmpl"}

app = FastAPI(title="llmserve", docs_url=None, redoc_url=None)
app.add_middleware(RequestIdentityMiddleware)


def _error_response(e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@app.exception_handler(OpenAIError)
async def _openai_error(_: Request, e: OpenAIError) -> JSONResponse:
    return _error_response(e)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
    return _error_response(OpenAIError(e.status_code, str(e.detail)))


@app.exception_handler(Exception)
async def _unexpected(_: Request, e: Exception) -> JSONResponse:
    logger.exception("unexpected error")
    return _error_response(OpenAIError(500, "internal server error", type="server_error"))


class _OpenStream:
    """A generation whose first item has arrived (so errors surface as an HTTP status)."""

    def __init__(self, builder: ResponseBuilder, first, rest: DeploymentResponseGenerator, usage):
        self.builder = builder
        self.first = first
        self.rest = rest
        self.include_usage = usage


def _sse(data: dict[str, Any] | str, event: str | None = None) -> ServerSentEvent:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return ServerSentEvent(data=text, event=event)


@serve.deployment
@serve.ingress(app)
class Router:
    def __init__(self, config: dict[str, Any], llm_handles: dict[str, DeploymentHandle]) -> None:
        self._config = AppConfig.model_validate(config)
        self._handles = llm_handles
        self._created = int(time.time())

    # ------------------------------------------------------------------------------ HTTP routes

    @app.get("/v1/models")
    async def http_models(self) -> dict[str, Any]:
        return models_list(list(self._handles), self._created)

    @app.get("/healthz")
    async def http_health(self) -> JSONResponse:
        return JSONResponse({"status": "ok", "models": list(self._handles)})

    @app.post("/v1/chat/completions")
    async def http_chat(self, request: Request):
        return await self._http(request, "chat")

    @app.post("/v1/completions")
    async def http_completions(self, request: Request):
        return await self._http(request, "completion")

    async def _http(self, request: Request, kind: Kind):
        body = parse_json_body(await self._read_body(request))
        stream = await self._open_stream(kind, body)
        if body.get("stream") is True:
            return EventSourceResponse(self._sse_events(stream), sep="\n", ping=15)
        return JSONResponse(await self._collect(stream))

    async def _read_body(self, request: Request) -> bytes:
        limit = self._config.http.max_request_body_bytes
        too_large = OpenAIError(413, f"request body is larger than {limit} bytes",
                                code="request_too_large")  # fmt: skip
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise too_large
            chunks.append(part)
        return b"".join(chunks)

    # -------------------------------------------------------------------- handle API (Python)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """Non-streaming chat completion for DeploymentHandle callers; raises OpenAIError."""
        return await self._collect(await self._open_stream("chat", body))

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._collect(await self._open_stream("completion", body))

    async def stream_chat_completions(self, body: dict[str, Any]) -> AsyncIterator[dict]:
        """Streaming chat completion: yields OpenAI chunk dicts (call with stream=True)."""
        async for chunk in self._chunks(await self._open_stream("chat", body)):
            yield chunk

    async def stream_completions(self, body: dict[str, Any]) -> AsyncIterator[dict]:
        async for chunk in self._chunks(await self._open_stream("completion", body)):
            yield chunk

    # ---------------------------------------------------------------------------------- core

    async def _open_stream(self, kind: Kind, body: dict[str, Any]) -> _OpenStream:
        req = parse_request(kind, body)
        handle = self._handles.get(req.model)
        if handle is None:
            raise OpenAIError(
                404,
                f"The model '{req.model}' does not exist. Known models: "
                f"{', '.join(sorted(self._handles))}",
                param="model",
                code="model_not_found",
            )
        response_id = f"{ID_PREFIX[kind]}-{uuid.uuid4().hex}"
        gen_request = req.to_generation(response_id, self._config.http.max_n)
        stream: DeploymentResponseGenerator = handle.options(stream=True).generate.remote(
            gen_request
        )
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            raise OpenAIError(500, "the engine ended the stream without output") from None
        except asyncio.CancelledError:
            stream.cancel()  # the caller left: do not leave the engine working for nobody
            raise
        except Exception as e:
            stream.cancel()
            logger.warning("request %s failed before output: %r", response_id, e)
            raise OpenAIError(503, f"model '{req.model}' is unavailable; retry shortly",
                              headers={"Retry-After": "1"}) from None  # fmt: skip
        if isinstance(first, GenerationError):
            raise OpenAIError(first.status, first.message, param=first.param, code=first.code,
                              type=first.type)  # fmt: skip
        builder = ResponseBuilder(kind, response_id, req.model, req.n)
        return _OpenStream(builder, first, stream, req.include_usage)

    async def _chunks(self, s: _OpenStream) -> AsyncIterator[dict[str, Any]]:
        """OpenAI stream chunks; raises OpenAIError if the engine fails mid-stream."""
        done = False
        try:
            for c in s.builder.add(s.first):
                yield c
            async for item in s.rest:
                if isinstance(item, GenerationError):
                    raise OpenAIError(item.status, item.message, param=item.param, type=item.type)
                for c in s.builder.add(item):
                    yield c
            done = True
            if s.include_usage:
                yield s.builder.usage_chunk()
        finally:
            if not done:
                s.rest.cancel()

    async def _collect(self, s: _OpenStream) -> dict[str, Any]:
        async for _ in self._chunks(s):
            pass
        return s.builder.response()

    async def _sse_events(self, s: _OpenStream) -> AsyncIterator[ServerSentEvent]:
        try:
            async for chunk in self._chunks(s):
                yield _sse(chunk)
        except OpenAIError as e:
            yield _sse(e.body(), event="error")
        except Exception as e:  # replica died mid-stream: tell the client, then close cleanly
            logger.warning("stream %s failed: %r", s.builder.id, e)
            err = OpenAIError(503, "the model replica failed during generation; retry")
            yield _sse(err.body(), event="error")
        yield _sse("[DONE]")
