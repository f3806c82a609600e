"""Router: the ingress deployment. OpenAI-compatible HTTP API, dispatch by model name.

The HTTP routes and the Python handle methods share one path (`_open_stream`), so a Ray app calling
`chat_completions` through a DeploymentHandle gets the same validation and errors as an HTTP client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.exceptions import RequestCancelledError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from sse_starlette import EventSourceResponse, ServerSentEvent

from deployments.admission_gate import Gate, Ticket
from deployments.http_app import http_app, read_body
from deployments.request_log import RequestTrail
from deployments.request_path import OpenStream, outcome_of, prompt_chars, sse, timeout_field
from serve_app import tracing
from serve_app.config import AppConfig, TenantConfig
from serve_app.generation import GenerationError
from serve_app.metrics import RouterMetrics
from serve_app.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    parse_json_body,
    parse_request,
)
from serve_app.openai_responses import ResponseBuilder, models_list
from serve_app.openapi_docs import openapi_extra
from serve_app.tenancy import TenantDirectory, estimate_prompt_tokens, request_terms

logger = logging.getLogger("ray.serve")
Kind = Literal["chat", "completion"]
ID_PREFIX = {"chat": "chatcmpl", "completion": "cmpl"}
TICK_S = 0.1  # queue expiry resolution
REPLICA_REFRESH_S = 2.0
RECLAIM_GRACE_S = 5.0

app = http_app()


# Helpers used by Router methods live above the class or in deployments/request_path.py:
# @serve.ingress pickles the FastAPI app, and with it the route methods, by value while this
# module is still being imported.
@serve.deployment
@serve.ingress(app)
class Router:
    async def __init__(
        self, config: dict[str, Any], llm_handles: dict[str, DeploymentHandle]
    ) -> None:
        self._config = AppConfig.model_validate(config)
        self._handles = llm_handles
        self._created = int(time.time())
        self._directory = TenantDirectory(self._config, os.environ)
        self._gate = Gate(self._config, self._directory.tenants, self._config.router.num_replicas)
        self._deployment_names = {
            m.name: h.deployment_name for m, h in zip(self._config.models, llm_handles.values())
        }
        # Dispatched and not yet finished, by entry id: the housekeeping loop enforces their
        # deadlines (one timer for all instead of a timeout around every chunk).
        self._dispatched: dict[str, tuple[Ticket, DeploymentResponseGenerator]] = {}
        self._metrics = RouterMetrics()
        tracing.configure_tracing(**self._config.tracing.model_dump())
        self._background = asyncio.get_running_loop().create_task(self._housekeeping())

    async def _housekeeping(self) -> None:
        """Expire queued requests; follow each model's live replica count."""
        last_refresh = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            self._gate.tick()
            self._enforce_deadlines()
            if time.monotonic() - last_refresh > REPLICA_REFRESH_S:
                last_refresh = time.monotonic()
                await self._refresh_replicas()
                self._metrics.export(self._gate.snapshot(), self._gate.num_rejected)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for entry_id, (ticket, stream) in list(self._dispatched.items()):
            if ticket.finished:
                del self._dispatched[entry_id]
            elif now > ticket.deadline_s and not ticket.expired:
                # Cancelling aborts the engine request; the reader then gets a 504.
                ticket.expired = True
                stream.cancel()
            elif now > ticket.deadline_s + RECLAIM_GRACE_S:
                # A streaming response whose body was never iterated (the client vanished
                # between the headers and the first read) never runs its own cleanup.
                logger.warning("reclaiming abandoned request %s", entry_id)
                self._gate.finish(ticket, 0)
                del self._dispatched[entry_id]

    async def _refresh_replicas(self) -> None:
        try:
            app = serve.get_replica_context().app_name
            status = await asyncio.to_thread(serve.status)
            deployments = status.applications[app].deployments
        except Exception as e:  # controller busy or restarting: keep the last known counts
            logger.debug("replica refresh failed: %r", e)
            return
        for model, name in self._deployment_names.items():
            d = deployments.get(name)
            if d is not None:
                self._gate.set_live_replicas(model, d.replica_states.get("RUNNING", 0))

    # ------------------------------------------------------------------------------ HTTP routes

    @app.get("/v1/models", openapi_extra=openapi_extra(errors=(401,)))
    async def http_models(self, request: Request) -> dict[str, Any]:
        # Keys are checked here too, and a tenant sees only the models it may use.
        tenant = self._directory.authenticate(request.headers.get("authorization"))
        allowed = [m for m in self._handles if tenant.models is None or m in tenant.models]
        return models_list(allowed, self._created)

    @app.get("/healthz")
    async def http_health(self) -> JSONResponse:
        return JSONResponse({"status": "ok", "models": self._gate.snapshot()})

    @app.get("/readyz")
    async def http_ready(self) -> JSONResponse:
        """For load balancers and Kubernetes readiness probes: 200 once every model serves."""
        waiting = self._gate.not_ready()
        if waiting:
            what = "; ".join(f"{m}: {why}" for m, why in sorted(waiting.items()))
            raise OpenAIError(503, f"not ready: {what}", code="not_ready",
                              headers={"Retry-After": "5"})  # fmt: skip
        return JSONResponse({"status": "ready", "models": sorted(self._handles)})

    @app.post("/v1/chat/completions", openapi_extra=openapi_extra(ChatCompletionRequest))
    async def http_chat(self, request: Request):
        return await self._http(request, "chat")

    @app.post("/v1/completions", openapi_extra=openapi_extra(CompletionRequest))
    async def http_completions(self, request: Request):
        return await self._http(request, "completion")

    async def _http(self, request: Request, kind: Kind):
        trail = self._trail(kind, request.scope.get("state", {}).get("request_id", ""))
        try:
            # The key is checked before the body is even read: no work for strangers.
            with tracing.tracer.start_as_current_span("authenticate", record_exception=False):
                tenant = self._directory.authenticate(request.headers.get("authorization"))
            trail.tenant = tenant.name
            request.state.response_headers = {**self._gate.rate_headers(tenant),
                                              "x-llmserve-tenant": tenant.name}  # fmt: skip
            body = parse_json_body(
                await read_body(request, self._config.http.max_request_body_bytes))
            trail.stream = body.get("stream") is True
            session = request.headers.get("x-session-id")
            stream = await self._open_stream(kind, body, tenant,
                                             session[:128] if session else None, trail)  # fmt: skip
            request.state.response_headers = {**stream.headers, "x-llmserve-tenant": tenant.name}
            if trail.stream:
                return EventSourceResponse(self._sse_events(stream, trail), sep="\n", ping=15)
            response = JSONResponse(await self._collect(stream))
            trail.finish("ok")
            return response
        except BaseException as e:
            trail.finish(*outcome_of(e))
            raise

    def _trail(self, kind: str, request_id: str) -> RequestTrail:
        return RequestTrail(self._metrics, request_id, tracing.current_trace_id(), kind)

    # -------------------------------------------------------------------- handle API (Python)

    async def chat_completions(self, body: dict[str, Any], api_key: str | None = None) -> dict:
        """Non-streaming chat completion for DeploymentHandle callers; raises OpenAIError."""
        return await self._handle_call("chat", body, api_key)

    async def completions(self, body: dict[str, Any], api_key: str | None = None) -> dict:
        return await self._handle_call("completion", body, api_key)

    async def stream_chat_completions(
        self, body: dict[str, Any], api_key: str | None = None
    ) -> AsyncIterator[dict]:
        """Streaming chat completion: yields OpenAI chunk dicts (call with stream=True)."""
        async for chunk in self._handle_stream("chat", body, api_key):
            yield chunk

    async def stream_completions(
        self, body: dict[str, Any], api_key: str | None = None
    ) -> AsyncIterator[dict]:
        async for chunk in self._handle_stream("completion", body, api_key):
            yield chunk

    async def _handle_call(self, kind: Kind, body: dict[str, Any], api_key: str | None) -> dict:
        trail = self._trail(kind, str(uuid.uuid4()))
        try:
            tenant = self._auth(api_key)
            trail.tenant = tenant.name
            result = await self._collect(await self._open_stream(kind, body, tenant,
                                                                 trail=trail))  # fmt: skip
            trail.finish("ok")
            return result
        except BaseException as e:
            trail.finish(*outcome_of(e))
            raise

    async def _handle_stream(self, kind: Kind, body: dict[str, Any], api_key: str | None):
        trail = self._trail(kind, str(uuid.uuid4()))
        trail.stream = True
        try:
            tenant = self._auth(api_key)
            trail.tenant = tenant.name
            stream = await self._open_stream(kind, body, tenant, trail=trail)
            async for chunk in self._chunks(stream):
                yield chunk
            trail.finish("ok")
        except BaseException as e:
            trail.finish(*outcome_of(e))
            raise

    def queue_stats(self) -> dict[str, dict[str, int]]:
        """Per model: this Router replica's in-flight cap, in-flight count and queue depth."""
        return self._gate.snapshot()

    def _auth(self, api_key: str | None) -> TenantConfig:
        return self._directory.authenticate(f"Bearer {api_key}" if api_key else None)

    # ---------------------------------------------------------------------------------- core

    async def _open_stream(
        self,
        kind: Kind,
        body: dict[str, Any],
        tenant: TenantConfig,
        session_id: str | None = None,
        trail: RequestTrail | None = None,
    ) -> OpenStream:
        trail = trail or self._trail(kind, "")
        trail.priority = tenant.priority
        req = parse_request(kind, body)
        handle = self._handles.get(req.model)
        if handle is None:
            # Only the models this tenant may use: the others are none of its business.
            known = [m for m in self._handles if tenant.models is None or m in tenant.models]
            raise OpenAIError(
                404,
                f"The model '{req.model}' does not exist. Known models: {', '.join(sorted(known))}",
                param="model",
                code="model_not_found",
            )
        response_id = f"{ID_PREFIX[kind]}-{uuid.uuid4().hex}"
        gen = req.to_generation(response_id, self._config.http.max_n)
        model = self._config.model(req.model)
        terms = request_terms(tenant, req.model, gen.max_tokens, timeout_field(body),
                              model.max_tokens_default)  # fmt: skip
        num_tokens = estimate_prompt_tokens(prompt_chars(gen)) + terms.max_tokens * req.n
        trail.model = req.model
        # A refusal (429, 503) is an answer, not a crash: no traceback on the span. Formatting
        # one for every 429 of a flood took a tenth of the Router's event loop.
        with tracing.tracer.start_as_current_span("admit", record_exception=False) as span:
            ticket = await self._gate.admit(tenant, req.model, num_tokens, terms.timeout_s)
            span.set_attribute("llmserve.queue_wait_s", ticket.queue_wait_s)
        trail.queue_wait_s = ticket.queue_wait_s
        headers = dict(ticket.rate_headers)
        if terms.max_tokens_clamped_from is not None:
            headers["x-max-tokens-clamped"] = f"{terms.max_tokens_clamped_from}->{terms.max_tokens}"
        gen = dataclasses.replace(gen, max_tokens=terms.engine_max_tokens,
                                  priority=self._gate.priority(tenant))  # fmt: skip
        session = session_id or req.user or ""
        try:
            with tracing.tracer.start_as_current_span("dispatch") as span:
                gen = dataclasses.replace(gen, trace_headers=tracing.current_trace_headers())
                stream, first = await self._dispatch(handle, gen, ticket, session)
                span.set_attribute("llmserve.replica", first.replica_id or "")
        except BaseException:
            self._gate.finish(ticket, 0)
            raise
        trail.first_s = time.monotonic()
        trail.replica = first.replica_id
        trail.num_prompt_tokens = first.num_prompt_tokens
        if self._config.http.debug_headers and first.replica_id:
            headers["x-replica"] = first.replica_id
        builder = ResponseBuilder(kind, response_id, req.model, req.n)
        # Not the current span: the stream is consumed later, possibly in another task.
        span = tracing.tracer.start_span("stream", attributes={"llmserve.model": req.model})
        return OpenStream(builder, first, stream, req.include_usage, ticket, headers, trail, span)

    async def _dispatch(self, handle: DeploymentHandle, gen, ticket: Ticket, session: str):
        """Sends to a replica and waits for its first item. A replica that fails before any
        output (it died, or says it is unhealthy) costs one retry on another replica."""
        for attempt in (1, 2):
            options = {"stream": True, "session_id": session} if session else {"stream": True}
            stream: DeploymentResponseGenerator = handle.options(**options).generate.remote(gen)
            self._dispatched[ticket.entry_id] = (ticket, stream)
            try:
                first = await self._next(stream, ticket)
            except (OpenAIError, asyncio.CancelledError):
                stream.cancel()  # the caller left or the deadline passed
                raise
            except StopAsyncIteration:
                raise OpenAIError(500, "the engine ended the stream without output") from None
            except Exception as e:
                stream.cancel()
                logger.warning("request %s failed before output on attempt %d: %r",
                               gen.request_id, attempt, e)  # fmt: skip
                if attempt == 2:
                    raise OpenAIError(503, "the model is unavailable; retry shortly",
                                      headers={"Retry-After": "1"}) from None  # fmt: skip
                continue
            if isinstance(first, GenerationError):
                if first.code == "replica_unhealthy" and attempt == 1:
                    # Retry elsewhere: the refusing replica scores best (it holds nothing) until
                    # it exits, so the request router must be told to skip it.
                    gen = dataclasses.replace(gen, avoid_replica_id=first.replica_id)
                    continue
                raise OpenAIError(first.status, first.message, param=first.param,
                                  code=first.code, type=first.type)  # fmt: skip
            return stream, first
        raise AssertionError("unreachable")

    async def _next(self, stream: DeploymentResponseGenerator, ticket: Ticket):
        """The stream's next item, or a 504 once the request's deadline has cancelled it."""
        try:
            return await stream.__anext__()
        except RequestCancelledError:
            if not ticket.expired:
                raise
            self._gate.num_rejected[(ticket.model, "deadline")] += 1
            raise OpenAIError(504, "the request's deadline passed during generation",
                              code="deadline_exceeded") from None  # fmt: skip

    async def _chunks(self, s: OpenStream) -> AsyncIterator[dict[str, Any]]:
        """OpenAI stream chunks; raises OpenAIError if the engine fails mid-stream."""
        done = False
        try:
            for c in s.builder.add(s.first):
                yield c
            while True:
                try:
                    item = await self._next(s.rest, s.ticket)
                except StopAsyncIteration:
                    break
                except (OpenAIError, asyncio.CancelledError):
                    raise
                except Exception as e:  # the replica or its engine died mid-generation
                    logger.warning("request %s failed during generation: %r", s.builder.id, e)
                    raise OpenAIError(503, "the model replica failed during generation; retry",
                                      headers={"Retry-After": "1"}) from None  # fmt: skip
                if isinstance(item, GenerationError):
                    raise OpenAIError(item.status, item.message, param=item.param, type=item.type)
                for c in s.builder.add(item):
                    yield c
            done = True
            if s.include_usage:
                yield s.builder.usage_chunk()
        finally:
            if not done:
                s.rest.cancel()  # aborts the engine request and frees its KV blocks
            usage = s.builder.usage()
            s.span.set_attribute("llmserve.completion_tokens", usage["completion_tokens"])
            s.span.set_attribute("llmserve.completed", done)
            s.span.end()
            s.trail.num_completion_tokens = usage["completion_tokens"]
            self._gate.finish(s.ticket, usage["total_tokens"])
            self._dispatched.pop(s.ticket.entry_id, None)

    async def _collect(self, s: OpenStream) -> dict[str, Any]:
        async for _ in self._chunks(s):
            pass
        return s.builder.response()

    async def _sse_events(
        self, s: OpenStream, trail: RequestTrail
    ) -> AsyncIterator[ServerSentEvent]:
        outcome: tuple[str, str] = ("cancelled", "")  # unless it gets further
        try:
            async for chunk in self._chunks(s):
                yield sse(chunk)
            outcome = ("ok", "")
        except OpenAIError as e:
            outcome = outcome_of(e)
            yield sse(e.body(), event="error")
        except Exception:  # a bug of ours: still end the stream the way clients expect
            logger.exception("stream %s failed", s.builder.id)
            outcome = ("500", "")
            yield sse(OpenAIError(500, "internal server error").body(), event="error")
        finally:
            trail.finish(*outcome)
        yield sse("[DONE]")
