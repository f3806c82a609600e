"""The Router's FastAPI app shell: request identity and tracing, OpenAI-shaped errors for every
failure, the early refusal of what the API key alone decides, and the request body read under a
size limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware

from llmserve.observability.tracing import RequestIdentityMiddleware
from llmserve.protocol.openai_protocol import OpenAIError

logger = logging.getLogger("ray.serve")


def _error_response(e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _openai_error(_: Request, e: OpenAIError) -> JSONResponse:
    return _error_response(e)


async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
    return _error_response(OpenAIError(e.status_code, str(e.detail)))


async def _unexpected(_: Request, e: Exception) -> JSONResponse:
    logger.exception("unexpected error")
    return _error_response(OpenAIError(500, "internal server error", type="server_error"))


def http_app() -> FastAPI:
    # /openapi.json is a route of the Router's: it merges the engine's request schemas in.
    app = FastAPI(title="llmserve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RequestIdentityMiddleware)
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    return app


class EarlyRefusal:
    """Answers, before FastAPI routes, parses or validates anything, the requests that the API
    key alone decides: no key or a wrong one (401), a tenant over its request rate (429).

    Pure ASGI, just inside RequestIdentityMiddleware (so a refusal still carries its request id,
    trace and rate-limit headers). A flood of refusals is what admission must shed cheaply:
    FastAPI's routing, dependency solving and exception handlers were about half of the Router's
    CPU per refusal. `refuse(scope)` returns the error, or None to let the request through.
    """

    def __init__(self, app, refuse: Callable[[dict], OpenAIError | None], paths: frozenset[str]):
        self.app, self.refuse, self.paths = app, refuse, paths

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and _route_path(scope) in self.paths
        ):
            error = self.refuse(scope)
            if error is not None:
                await _error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _route_path(scope) -> str:
    """The path as the app's routes see it: without the app's route prefix (`root_path`)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root + "/") else path


def with_early_refusal(
    app: FastAPI, refuse: Callable[[dict], OpenAIError | None], paths: frozenset[str]
) -> FastAPI:
    """`app` with EarlyRefusal innermost of its middleware, before its first request."""
    app.user_middleware.append(Middleware(EarlyRefusal, refuse=refuse, paths=paths))
    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or 413 as soon as it is known to exceed `limit` bytes (declared length
    first, then counted while reading, for chunked uploads)."""
    too_large = OpenAIError(
        413, f"request body is larger than {limit} bytes", code="request_too_large"
    )
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
