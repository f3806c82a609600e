"""The Router's request path past the key check, shared by its HTTP routes and its
DeploymentHandle methods (so a Ray app calling `chat_completions` gets the same admission and
errors as an HTTP client): read the fields admission needs, admit the request at the door,
rewrite what the platform decides (the tenant's max_tokens cap, its priority), forward the body
to one of the model's replicas, and wait for the reply's head.

In its own module (imported, so pickled by reference): @serve.ingress pickles the Router's app by
value while llmserve/router/router.py is still being imported.
"""

from __future__ import annotations

import time
from typing import Any

from ray.serve.handle import DeploymentHandle

from llmserve.config.app_config import AppConfig, TenantConfig
from llmserve.observability import tracing
from llmserve.observability.metrics import RouterMetrics
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
from llmserve.request_router import route_notes
from llmserve.router.admission_gate import Gate
from llmserve.router.reply_relay import ReplyRelay
from llmserve.router.request_log import RequestTrail
from llmserve.router.request_path import OpenReply, session_of
from llmserve.router.tenancy import estimate_prompt_tokens, model_not_found, request_terms


class Dispatcher:
    """One per Router replica: its models' handles, its door (the Gate) and its reply relay."""

    def __init__(
        self,
        config: AppConfig,
        handles: dict[str, DeploymentHandle],
        gate: Gate,
        relay: ReplyRelay,
        metrics: RouterMetrics,
    ) -> None:
        self._config = config
        self._handles = handles
        self._gate = gate
        self._relay = relay
        self._metrics = metrics
        self._by_priority = {
            m.name: m.engine.scheduling_policy == "priority" for m in config.models
        }

    def trail(self, path: str, request_id: str) -> RequestTrail:
        kind = {CHAT_PATH: "chat", COMPLETIONS_PATH: "completion", RESPONSES_PATH: "response"}.get(
            path, path.rsplit("/")[-1]
        )
        return RequestTrail(self._metrics, request_id, tracing.current_trace_id(), kind)

    async def open(
        self,
        path: str,
        body: dict[str, Any],
        body_size: int,
        tenant: TenantConfig,
        request_id: str,
        headers: tuple[tuple[str, str], ...] = (),
        session_id: str | None = None,
        trail: RequestTrail | None = None,
    ) -> OpenReply:
        """Admits, forwards and waits for the reply's head; raises OpenAIError."""
        trail = trail or self.trail(path, request_id)
        trail.priority = tenant.priority
        trail.ttft_objective_s = self._config.admission.ttft_objective_s_by_class.get(
            tenant.priority
        )
        token_fields = max_tokens_fields(path)
        fields = read_fields(body, self._config.http.max_n, token_fields)
        if path == RESPONSES_PATH:
            check_responses_body(body)
        handle = self._handles.get(fields.model)
        model = self._config.model(fields.model)
        if handle is None:
            raise model_not_found(fields.model)  # the same words as "not yours"
        generates = path in GENERATION_PATHS
        terms = request_terms(
            tenant, fields.model, fields.max_tokens, fields.timeout_s, model.max_tokens_default
        )
        num_tokens = estimate_prompt_tokens(body_size)
        if generates:
            num_tokens += terms.max_tokens * fields.n
        trail.model = fields.model
        # A refusal (429, 503) is an answer, not a crash: no traceback on the span. Formatting
        # one for every 429 of a flood took a tenth of the Router's event loop.
        with tracing.tracer.start_as_current_span("admit", record_exception=False) as span:
            ticket = await self._gate.admit(tenant, fields.model, num_tokens, terms.timeout_s)
            span.set_attribute("llmserve.queue_wait_s", ticket.queue_wait_s)
        trail.queue_wait_s = ticket.queue_wait_s
        reply_headers = dict(ticket.rate_headers)
        if terms.max_tokens_clamped_from is not None:
            reply_headers["x-max-tokens-clamped"] = (
                f"{terms.max_tokens_clamped_from}->{terms.max_tokens}"
            )
        try:
            priority = self._gate.priority(tenant) if self._by_priority[fields.model] else None
            forwarded = (
                rewrite_body(body)
                if not generates
                else rewrite_body(
                    body,
                    default_max_tokens=model.max_tokens_default,
                    max_tokens_cap=tenant.max_tokens_cap,
                    priority=priority,
                    token_fields=token_fields,
                )
            )
            with tracing.tracer.start_as_current_span("dispatch") as span:
                trace_headers = tuple(tracing.current_trace_headers().items())
                request = ReplicaRequest(
                    request_id,
                    path,
                    forwarded,
                    (
                        *[(k, v) for k, v in headers if k not in ("traceparent", "tracestate")],
                        *trace_headers,
                        ("x-request-id", request_id),
                        (TENANT_HEADER, tenant.name),
                        *(
                            ()
                            if any(k == "content-type" for k, _ in headers)
                            else (("content-type", "application/json"),)
                        ),
                    ),
                )
                dispatched_s = time.monotonic()
                stream, head = await self._relay.dispatch(
                    handle, request, ticket, session_id or session_of(body)
                )
                span.set_attribute("llmserve.replica", head.replica_id)
                route = route_notes.take(request_id)
                if route is not None:
                    span.set_attributes(route.attributes())
        except BaseException:
            self._gate.finish(ticket, 0)
            raise
        trail.first_s = time.monotonic()
        trail.replica = head.replica_id
        if self._config.http.debug_headers and head.replica_id:
            reply_headers["x-replica"] = head.replica_id
            if route is not None:
                reply_headers["x-route"] = route.header()
        # Not the current span: the reply is consumed later, possibly in another task.
        span = tracing.tracer.start_span("stream", attributes={"llmserve.model": fields.model})
        return OpenReply(head, stream, ticket, reply_headers, trail, span, dispatched_s)
