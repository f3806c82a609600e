"""Router: the ingress deployment. The OpenAI HTTP API: keys, admission, dispatch by model name.

The Router does what is the platform's: API keys and tenants, rate limits, the per-model queue,
deadlines, priority, metrics and traces. The request itself is vLLM's: the Router reads the few
fields admission needs, rewrites the ones the platform decides (the tenant's max_tokens cap, its
priority), forwards the body to a replica, and relays the replica's reply as it comes: ready
bytes, several tokens per item, never parsed. The HTTP routes and the Python handle methods share
one path (`Dispatcher.open`, llmserve/router/dispatch.py), so a Ray app calling `chat_completions`
through a DeploymentHandle gets the same admission and errors as an HTTP client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from llmserve.config.app_config import AppConfig, TenantConfig
from llmserve.config.host_fit import HeldBack
from llmserve.observability import tracing
from llmserve.observability.metrics import RouterMetrics
from llmserve.protocol.openai_protocol import (
    OpenAIError,
    parse_json_body,
    response_not_found,
)
from llmserve.protocol.replica_call import CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH
from llmserve.protocol.replica_call import FORWARDED_PATHS as REPLICA_PATHS
from llmserve.responses.stored_responses import StoredResponse
from llmserve.router import openapi_docs, shield
from llmserve.router.admission_gate import Gate
from llmserve.router.dispatch import ClientRequest, Dispatcher
from llmserve.router.http_app import http_app, read_body, with_early_refusal
from llmserve.router.reply_relay import ReplyRelay
from llmserve.router.request_log import outcome_of
from llmserve.router.request_path import (
    SseChunks,
    body_size,
    edge_wait_of,
    health_counts,
    unless_disconnected,
)
from llmserve.router.served_table import ServedTable
from llmserve.router.tenancy import TenantDirectory, may_use
from llmserve.router.wake import Waker

logger = logging.getLogger("ray.serve")
TICK_S = 0.1  # queue expiry resolution
REPLICA_REFRESH_S = 2.0
REFRESH_TIMEOUT_S = 10.0  # a stalled controller: keep the last counts, ask again later
# Request headers a replica gets (the engine's server reads them); the API key is not one.
FORWARDED_HEADERS = ("content-type", "traceparent", "tracestate")
# The routes that forward to a replica: their keys and rate are checked before FastAPI runs.
FORWARDED_PATHS = frozenset(REPLICA_PATHS)

app = http_app()


# Helpers of the routes live in other modules: @serve.ingress pickles this class by value
# (llmserve/router/__init__.py).
@serve.deployment
@serve.ingress(app)
class Router:
    async def __init__(
        self,
        config: dict[str, Any],
        llm_handles: dict[str, DeploymentHandle],
        response_store: DeploymentHandle | None = None,
        held_back: dict[str, HeldBack] | None = None,  # names this host cannot serve, and why
    ) -> None:
        self._config = AppConfig.model_validate(config)
        self._handles = llm_handles
        self._response_store = response_store
        self._created = int(time.time())
        self._directory = TenantDirectory(self._config, os.environ)
        # `model` name -> its model and adapter: the args', and adapters loaded at runtime.
        self._served = ServedTable(
            self._config, lambda m: llm_handles[m].served_adapters.remote(), held_back=held_back
        )
        try:
            # Into this node's folder beside its HAProxy's files (llmserve/router/shield.py).
            shield_map = shield.publish(
                self._directory,
                self._config.admission.shield_factor,
                serve.get_replica_context().app_name,
                os.environ,
                ray.get_runtime_context().get_node_id(),
            )
            logger.info("shield's map for HAProxy: %s", shield_map)
        except OSError as e:  # the Router serves on; its own buckets refuse the floods
            logger.warning("HAProxy's shield is off: %s", e)
        routers = self._config.router.num_replicas
        self._gate = Gate(self._config, self._directory.tenants, routers, wake=Waker(llm_handles))
        self._deployment_names = {
            m.name: h.deployment_name for m, h in zip(self._config.models, llm_handles.values())
        }
        self._relay = ReplyRelay(self._gate)
        self._metrics = RouterMetrics()
        self._dispatch = Dispatcher(
            self._config, self._served, llm_handles, self._gate, self._relay, self._metrics
        )
        self._engine_openapi: dict | None = None  # vLLM's document, from the first replica
        tracing.configure_tracing(**self._config.tracing.model_dump())
        self._background = asyncio.get_running_loop().create_task(self._housekeeping())
        self._served_refresh = asyncio.get_running_loop().create_task(self._served.run())

    def __serve_build_asgi_app__(self):
        """Serve's hook once this replica is constructed: the app it serves (its own copy of
        `app`) gets the early refusal, bound to this replica's tenants and gate."""
        return with_early_refusal(self.app, self._refuse_early, FORWARDED_PATHS)

    def _refuse_early(self, scope: dict[str, Any]) -> OpenAIError | None:
        """The key's tenant and its request rate, before the body is even read (no work for
        strangers, a flood refused cheaply); the tenant is left in the request's state."""
        state = scope.setdefault("state", {})
        state["edge_wait_s"] = edge_wait_of(scope)  # before anything of its own takes time
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        try:
            with tracing.tracer.start_as_current_span("authenticate", record_exception=False):
                tenant = self._directory.authenticate(
                    authorization.decode("latin-1") if authorization else None
                )
            state["tenant"] = tenant
            state["response_headers"] = {
                **self._gate.rate_headers(tenant),
                "x-llmserve-tenant": tenant.name,
            }
            self._gate.precheck(tenant)  # a flood is refused before its bodies are read
        except OpenAIError as e:
            trail = self._dispatch.trail(scope["path"], state.get("request_id") or "")
            if "tenant" in state:
                trail.tenant = state["tenant"].name
            trail.edge_wait_s = state["edge_wait_s"]
            trail.finish(*outcome_of(e))
            return e
        return None

    async def _housekeeping(self) -> None:
        """Expire queued requests and enforce deadlines every tick; follow each model's live
        replica count (ReplicaCounts, llmserve/protocol/route_note.py), asked of the Serve
        controller (which can stall for many seconds) in a task of its own where it must be."""
        last_refresh = 0.0
        refresh: asyncio.Task | None = None
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._gate.tick()
                self._relay.enforce_deadlines()
                now = self._gate.clock()
                if now - last_refresh > REPLICA_REFRESH_S:
                    last_refresh = now
                    if refresh is None or refresh.done():
                        refresh = asyncio.ensure_future(self._refresh_replicas())
                    self._metrics.export(self._gate.snapshot(), self._gate.num_rejected)
            except Exception:  # a bug of ours must not end deadline enforcement
                logger.exception("housekeeping tick failed")

    async def _refresh_replicas(self) -> None:
        app_name = serve.get_replica_context().app_name
        known, unknown = self._dispatch.replica_counts.split(self._deployment_names)
        if unknown:  # no request yet through these models' handles: ask the controller
            try:
                status = await asyncio.wait_for(asyncio.to_thread(serve.status), REFRESH_TIMEOUT_S)
                deployments = status.applications[app_name].deployments
            except Exception as e:  # controller busy or restarting: keep the last known counts
                logger.debug("replica refresh failed: %r", e)
                deployments = {}
            for model in unknown:
                d = deployments.get(self._deployment_names[model])
                if d is not None:
                    known[model] = d.replica_states.get("RUNNING", 0)
        for model, n in known.items():
            self._gate.set_live_replicas(model, n)

    # ------------------------------------------------------------------------------ HTTP routes

    @app.get("/v1/models", openapi_extra=openapi_docs.route_extra(errors=(401,)))
    async def http_models(self, request: Request) -> dict[str, Any]:
        # Keys are checked here too, and a tenant sees only the models it may use.
        tenant = self._directory.authenticate(request.headers.get("authorization"))
        await self._served.freshen()
        allowed = {n: s.model.name for n, s in self._served.items() if may_use(tenant, n, s)}
        return openapi_docs.models_list(allowed, self._created)

    @app.get("/healthz")
    async def http_health(self, request: Request) -> JSONResponse:
        """Liveness, and this replica's queue. Per model for a caller with a key (the models
        it may use); counts only for anyone else, who learns no model's name."""
        tenant = self._directory.optional(request.headers.get("authorization"))
        snapshot = self._gate.snapshot()
        if tenant is None:
            return JSONResponse({"status": "ok", **health_counts(snapshot)})
        mine = {m: s for m, s in snapshot.items() if tenant.models is None or m in tenant.models}
        return JSONResponse({"status": "ok", "models": mine})

    @app.get("/readyz")
    async def http_ready(self, request: Request) -> JSONResponse:
        """For load balancers and Kubernetes readiness probes: 200 once every model serves.
        Which ones do not, only to a caller with a key."""
        waiting = self._gate.not_ready()
        tenant = self._directory.optional(request.headers.get("authorization"))
        if waiting:
            what = f"{len(waiting)} of {len(self._handles)} models have no replica serving"
            if tenant is not None:
                what = "; ".join(f"{m}: {why}" for m, why in sorted(waiting.items()))
            raise OpenAIError(
                503, f"not ready: {what}", code="not_ready", headers={"Retry-After": "5"}
            )
        body: dict[str, Any] = {"status": "ready", "num_models": len(self._handles)}
        if tenant is not None:
            mine = [m for m in self._handles if tenant.models is None or m in tenant.models]
            body["models"] = sorted(mine)
            body["held_back"] = self._served.held_back_for(tenant.name)
        return JSONResponse(body)

    @app.get("/openapi.json", include_in_schema=False)
    async def http_openapi(self) -> JSONResponse:
        """The platform's routes with vLLM's own request schemas (from a replica's engine)."""
        if self._engine_openapi is None:
            self._engine_openapi = await self._fetch_engine_openapi()
        return JSONResponse(openapi_docs.document(app, self._engine_openapi))

    async def _fetch_engine_openapi(self) -> dict | None:
        for handle in self._handles.values():
            try:
                doc = await asyncio.wait_for(handle.openapi.remote(), timeout=10)
            except Exception as e:  # no replica yet: serve our own schema, ask again next time
                logger.debug("no engine OpenAPI document yet: %r", e)
                continue
            if doc:
                return doc
        return None

    @app.post(CHAT_PATH, openapi_extra=openapi_docs.route_extra(CHAT_PATH))
    async def http_chat(self, request: Request):
        return await self._http(request, CHAT_PATH)

    @app.post(COMPLETIONS_PATH, openapi_extra=openapi_docs.route_extra(COMPLETIONS_PATH))
    async def http_completions(self, request: Request):
        return await self._http(request, COMPLETIONS_PATH)

    @app.post(RESPONSES_PATH, openapi_extra=openapi_docs.route_extra(RESPONSES_PATH))
    async def http_responses(self, request: Request):
        return await self._http(request, RESPONSES_PATH)

    @app.get(RESPONSES_PATH + "/{response_id}", openapi_extra=openapi_docs.route_extra())
    async def http_response(self, response_id: str, request: Request) -> Response:
        """A stored response, from the app's store: whichever replica answered it."""
        if request.query_params.get("stream") in ("true", "True", "1"):
            raise OpenAIError(
                400,
                "stream is for background responses, which are not served",
                param="stream",
                code="unsupported_value",
            )
        entry = await self._stored_response(response_id, request)
        return Response(entry.response_json, media_type="application/json")

    @app.post(RESPONSES_PATH + "/{response_id}/cancel", openapi_extra=openapi_docs.route_extra())
    async def http_cancel_response(self, response_id: str, request: Request) -> Response:
        """vLLM's answer: only a background response runs on to be cancelled, and none does."""
        await self._stored_response(response_id, request)
        raise OpenAIError(
            400, "Cannot cancel a synchronous response.", param="response_id", code=400
        )

    async def _stored_response(self, response_id: str, request: Request) -> StoredResponse:
        tenant = self._directory.authenticate(request.headers.get("authorization"))
        self._gate.precheck(tenant)
        entry = None
        if self._response_store is not None:
            entry = await self._response_store.get.remote(response_id, tenant.name)
        if entry is None:  # unknown, forgotten, or another tenant's: the same words
            raise response_not_found(response_id)
        return entry

    @app.post("/tokenize", openapi_extra=openapi_docs.route_extra("/tokenize"))
    async def http_tokenize(self, request: Request):
        return await self._http(request, "/tokenize")

    @app.post("/detokenize", openapi_extra=openapi_docs.route_extra("/detokenize"))
    async def http_detokenize(self, request: Request):
        return await self._http(request, "/detokenize")

    @app.post("/v1/embeddings", openapi_extra=openapi_docs.route_extra("/v1/embeddings"))
    async def http_embeddings(self, request: Request):
        return await self._http(request, "/v1/embeddings")

    async def _http(self, request: Request, path: str):
        request_id = request.scope.get("state", {}).get("request_id") or str(uuid.uuid4())
        trail = self._dispatch.trail(path, request_id)
        with trail.finished_if_it_fails():
            tenant: TenantConfig = request.state.tenant  # EarlyRefusal let it through
            trail.tenant = tenant.name
            raw = await read_body(request, self._config.http.max_request_body_bytes)
            client = ClientRequest(
                path,
                parse_json_body(raw),
                len(raw),
                tenant,
                request_id,
                tuple((k, v) for k in FORWARDED_HEADERS if (v := request.headers.get(k))),
                (request.headers.get("x-session-id") or "")[:128] or None,
                request.state.edge_wait_s,
            )
            reply = await self._dispatch.open(client, trail)
            request.state.response_headers = {**reply.headers, "x-llmserve-tenant": tenant.name}
        head = reply.head
        if head.is_stream:
            trail.stream = True  # the relay finishes the trail at the stream's end
            return StreamingResponse(
                self._relay.sse(reply), status_code=head.status, media_type=head.content_type
            )
        with trail.finished_if_it_fails():
            content = await unless_disconnected(self._relay.collect(reply), request.receive)
        trail.finish("ok" if head.status < 400 else str(head.status))
        return Response(content, status_code=head.status, media_type=head.content_type)

    # -------------------------------------------------------------------- handle API (Python)

    async def chat_completions(self, body: dict[str, Any], api_key: str | None = None) -> dict:
        """Non-streaming chat completion for DeploymentHandle callers; raises OpenAIError."""
        return await self._handle_call(CHAT_PATH, {**body, "stream": False}, api_key)

    async def completions(self, body: dict[str, Any], api_key: str | None = None) -> dict:
        return await self._handle_call(COMPLETIONS_PATH, {**body, "stream": False}, api_key)

    async def stream_chat_completions(
        self, body: dict[str, Any], api_key: str | None = None
    ) -> AsyncIterator[dict]:
        """Streaming chat completion: yields OpenAI chunk dicts (call with stream=True)."""
        async for chunk in self._handle_stream(CHAT_PATH, {**body, "stream": True}, api_key):
            yield chunk

    async def stream_completions(
        self, body: dict[str, Any], api_key: str | None = None
    ) -> AsyncIterator[dict]:
        async for chunk in self._handle_stream(COMPLETIONS_PATH, {**body, "stream": True}, api_key):
            yield chunk

    async def responses(self, body: dict[str, Any], api_key: str | None = None) -> dict:
        """A Responses API response (stored for a follow-up by id, as over HTTP)."""
        return await self._handle_call(RESPONSES_PATH, {**body, "stream": False}, api_key)

    async def stream_responses(
        self, body: dict[str, Any], api_key: str | None = None
    ) -> AsyncIterator[dict]:
        """The Responses API's typed events as dicts (`type`: response.created, ...)."""
        async for event in self._handle_stream(RESPONSES_PATH, {**body, "stream": True}, api_key):
            yield event

    async def _handle_call(self, path: str, body: dict[str, Any], api_key: str | None) -> dict:
        request_id = str(uuid.uuid4())
        trail = self._dispatch.trail(path, request_id)
        with trail.finished_if_it_fails():
            tenant = self._auth(api_key)
            trail.tenant = tenant.name
            self._gate.precheck(tenant)
            client = ClientRequest(path, body, body_size(body), tenant, request_id)
            reply = await self._dispatch.open(client, trail)
            content = await self._relay.collect(reply)
            if reply.head.status >= 400:
                raise OpenAIError.from_reply(reply.head.status, content)
        trail.finish("ok")
        return json.loads(content)

    async def _handle_stream(self, path: str, body: dict[str, Any], api_key: str | None):
        request_id = str(uuid.uuid4())
        trail = self._dispatch.trail(path, request_id)
        trail.stream = True
        with trail.finished_if_it_fails():
            tenant = self._auth(api_key)
            trail.tenant = tenant.name
            client = ClientRequest(path, body, body_size(body), tenant, request_id)
            reply = await self._dispatch.open(client, trail)
            if not reply.head.is_stream:
                raise OpenAIError.from_reply(reply.head.status, await self._relay.collect(reply))
            chunks = SseChunks()
            async for data in self._relay.parts(reply):
                for chunk in chunks.feed(data):
                    yield chunk
        trail.finish("ok")

    def queue_stats(self) -> dict[str, dict[str, int]]:
        """Per model: this Router replica's in-flight cap, in-flight count and queue depth."""
        return self._gate.snapshot()

    def _auth(self, api_key: str | None) -> TenantConfig:
        return self._directory.authenticate(f"Bearer {api_key}" if api_key else None)
