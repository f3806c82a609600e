"""The Router's request path past the key check, shared by its HTTP routes and its
DeploymentHandle methods (so a Ray app calling `chat_completions` gets the same admission and
errors as an HTTP client): read the fields admission needs, admit the request, rewrite what
the platform decides (the tenant's max_tokens cap, its priority), forward the body to one of the
model's replicas, and wait for the reply's head.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ray.serve.handle import DeploymentHandle

from llmserve.config.app_config import AppConfig, ModelConfig, TenantConfig
from llmserve.observability import tracing
from llmserve.observability.metrics import RouterMetrics
from llmserve.policies.resume import Progress, resumable
from llmserve.protocol.openai_protocol import (
    check_responses_body,
    max_tokens_fields,
    read_fields,
    rewrite_body,
)
from llmserve.protocol.replica_call import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    GENERATION_PATHS,
    RESPONSES_PATH,
    TENANT_HEADER,
    ReplicaRequest,
)
from llmserve.protocol.route_note import ReplicaCounts, RouteSlip
from llmserve.router.admission_gate import Gate
from llmserve.router.reply_relay import ReplyRelay
from llmserve.router.request_log import RequestTrail
from llmserve.router.request_path import OpenReply, Resumable, session_of
from llmserve.router.served_table import ServedTable
from llmserve.router.tenancy import (
    estimate_prompt_tokens,
    may_use,
    model_not_served,
    request_terms,
)
from llmserve.router.ticket import Ticket


@dataclass(frozen=True)
class ClientRequest:
    """A request as the client sent it, past authentication."""

    path: str
    body: dict[str, Any]
    body_size: int  # bytes of JSON, for the prompt's token estimate
    tenant: TenantConfig
    request_id: str
    headers: tuple[tuple[str, str], ...] = ()  # those a replica gets (content-type, trace)
    session_id: str | None = None  # x-session-id; else the body's `user`
    edge_wait_s: float | None = None  # from HAProxy to this Router (its promise counts it)


@dataclass
class Admitted:
    """What admission decided for a request: its model, the handle to its replicas, the gate's
    ticket, and the reply headers of the platform's (rate limits, clamping notes)."""

    model: ModelConfig
    handle: DeploymentHandle
    ticket: Ticket
    token_fields: tuple[str, ...]  # where the request asks for its most tokens
    reply_headers: dict[str, str]
    adapter: str | None = None  # the LoRA adapter the request names (`model`), served by `model`


class Dispatcher:
    """One per Router replica: its models' handles, its admission gate and its reply relay."""

    def __init__(
        self,
        config: AppConfig,
        served: ServedTable,
        handles: dict[str, DeploymentHandle],
        gate: Gate,
        relay: ReplyRelay,
        metrics: RouterMetrics,
    ) -> None:
        self._config = config
        self._served = served  # `model` name -> its model and adapter
        self._handles = handles
        self._gate = gate
        self._relay = relay
        self._metrics = metrics
        # Handed to the request routers on each request; they write the replica counts into it.
        self.replica_counts = ReplicaCounts()

    def trail(self, path: str, request_id: str) -> RequestTrail:
        kind = {CHAT_PATH: "chat", COMPLETIONS_PATH: "completion", RESPONSES_PATH: "response"}.get(
            path, path.rsplit("/")[-1]
        )
        return RequestTrail(self._metrics, request_id, tracing.current_trace_id(), kind)

    async def open(self, client: ClientRequest, trail: RequestTrail | None = None) -> OpenReply:
        """Admits, forwards and waits for the reply's head; raises OpenAIError."""
        trail = trail or self.trail(client.path, client.request_id)
        admitted = await self._admit(client, trail)
        try:
            return await self._forward(client, admitted, trail)
        except BaseException:
            self._gate.finish(admitted.ticket, 0)
            raise

    async def _admit(self, client: ClientRequest, trail: RequestTrail) -> Admitted:
        """What admission reads from the body, then the gate's answer: a ticket, or a refusal
        (OpenAIError: 400, 404, 429, 503) raised."""
        tenant, body = client.tenant, client.body
        trail.priority = tenant.priority
        trail.edge_wait_s = client.edge_wait_s
        trail.ttft_objective_s = self._config.admission.ttft_objective_s_by_class.get(
            tenant.priority
        )
        token_fields = max_tokens_fields(client.path)
        fields = read_fields(body, self._config.http.max_n, token_fields)
        if client.path == RESPONSES_PATH:
            check_responses_body(body)
        # An adapter's requests are its base model's: its engines, its queue.
        served = await self._served.find(fields.model)
        if served is None or not may_use(tenant, fields.model, served):
            raise model_not_served(
                fields.model, self._served.held_back_reason(fields.model, tenant.name)
            )
        model = served.model
        handle = self._handles[model.name]
        terms = request_terms(tenant, fields.max_tokens, fields.timeout_s, model.max_tokens_default)
        num_tokens = estimate_prompt_tokens(client.body_size)
        if client.path in GENERATION_PATHS:
            num_tokens += terms.max_tokens * fields.n
        trail.model = fields.model
        # A refusal (429, 503) is an answer, not a crash: no traceback on the span (formatting
        # one for every 429 of a flood would take the Router's event loop).
        with tracing.tracer.start_as_current_span("admit", record_exception=False) as span:
            ticket = await self._gate.admit(
                tenant,
                model.name,
                num_tokens,
                terms.timeout_s,
                streamed=body.get("stream") is True,
                waited_s=client.edge_wait_s or 0.0,
            )
            span.set_attribute("llmserve.queue_wait_s", ticket.queue_wait_s)
        trail.queue_wait_s = ticket.queue_wait_s
        reply_headers = dict(ticket.rate_headers)
        if terms.max_tokens_clamped_from is not None:
            reply_headers["x-max-tokens-clamped"] = (
                f"{terms.max_tokens_clamped_from}->{terms.max_tokens}"
            )
        adapter = None if served.adapter is None else served.adapter.name
        return Admitted(model, handle, ticket, token_fields, reply_headers, adapter)

    def _replica_request(
        self, client: ClientRequest, admitted: Admitted, trace_headers: tuple[tuple[str, str], ...]
    ) -> ReplicaRequest:
        """The body rewritten where the platform decides (the model's default max_tokens, the
        tenant's cap and priority), with the headers a replica gets (the trace's: this span's
        context, not the client's)."""
        model, tenant = admitted.model, client.tenant
        track = model.routing.max_resumes > 0 and resumable(client.path, client.body)
        if client.path in GENERATION_PATHS:
            by_priority = model.engine.scheduling_policy == "priority"
            forwarded = rewrite_body(
                client.body,
                default_max_tokens=model.max_tokens_default,
                max_tokens_cap=tenant.max_tokens_cap,
                priority=self._gate.priority(tenant) if by_priority else None,
                token_fields=admitted.token_fields,
                return_token_ids=track,
            )
        else:
            forwarded = rewrite_body(client.body)
        headers = client.headers
        return ReplicaRequest(
            client.request_id,
            client.path,
            forwarded,
            (
                *[(k, v) for k, v in headers if k not in ("traceparent", "tracestate")],
                *trace_headers,
                ("x-request-id", client.request_id),
                (TENANT_HEADER, tenant.name),
                *(
                    ()
                    if any(k == "content-type" for k, _ in headers)
                    else (("content-type", "application/json"),)
                ),
            ),
            track_tokens=track,
            adapter=admitted.adapter,
            route=RouteSlip(replica_counts=self.replica_counts),
        )

    async def _forward(
        self, client: ClientRequest, admitted: Admitted, trail: RequestTrail
    ) -> OpenReply:
        """Sends the request to one of the model's replicas (the request router picks it) and
        waits for its reply's head."""
        with tracing.tracer.start_as_current_span("dispatch") as span:
            trace_headers = tuple(tracing.current_trace_headers().items())
            request = self._replica_request(client, admitted, trace_headers)
            dispatched_s = time.monotonic()
            session = client.session_id or session_of(client.body)
            stream, head = await self._relay.dispatch(
                admitted.handle, request, admitted.ticket, session
            )
            span.set_attribute("llmserve.replica", head.replica_id)
            if admitted.adapter is not None:
                span.set_attribute("llmserve.adapter", admitted.adapter)
            route = request.route.note  # the request router's, on the same object
            if route is not None:
                span.set_attributes(route.attributes())
        trail.first_s = time.monotonic()
        if head.is_stream:
            self._gate.first_token(admitted.ticket, self._gate.clock())
        trail.replica = head.replica_id
        reply_headers = admitted.reply_headers
        if self._config.http.debug_headers and head.replica_id:
            reply_headers["x-replica"] = head.replica_id
            if route is not None:
                reply_headers["x-route"] = route.header()
        # Not the current span: the reply is consumed later, possibly in another task.
        model = {"llmserve.model": admitted.model.name}
        span = tracing.tracer.start_span("stream", attributes=model)
        reply = OpenReply(head, stream, admitted.ticket, reply_headers, trail, span, dispatched_s)
        if request.track_tokens and head.stream_start is not None:
            progress = Progress(admitted.model.routing.max_resumes, head.stream_start)
            progress.add(head.token_ids)
            reply.resumable = Resumable(
                admitted.handle, request, session, progress, self._config.http.debug_headers
            )
            self._relay.allow_preemption(reply)
        return reply
