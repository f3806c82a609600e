"""Request identity and tracing: `x-request-id` and a W3C `traceparent` on every response, and
one OpenTelemetry trace per request across the Router and the replica.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which breaks client-disconnect
cancellation of streaming responses) continues an incoming `traceparent` or starts a trace. Spans
are exported where `configure_tracing` says: the app config's `tracing.exporter`, else the
standard `OTEL_TRACES_EXPORTER` (otlp, console, none; OTLP endpoint and protocol from the
standard OTEL_EXPORTER_OTLP_* variables). Without an exporter the ids are still generated and
returned so that a client can quote them.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_propagator = TraceContextTextMapPropagator()
# process.pid tells a trace's reader which Ray worker (Router or replica) a span came from.
_provider = TracerProvider(
    resource=Resource.create({"service.name": "llmserve", "process.pid": os.getpid()})
)
tracer = _provider.get_tracer("llmserve")
_configured = threading.Lock()
_exporter_in_use: str | None = None


class JsonLinesSpanExporter(SpanExporter):
    """One JSON line per finished span, appended to a file: for tests and quick debugging."""

    def __init__(self, path: str) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            ctx, parent = s.get_span_context(), s.parent
            lines.append(
                json.dumps(
                    {
                        "name": s.name,
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent_id": f"{parent.span_id:016x}" if parent else None,
                        "start_ns": s.start_time,
                        "end_ns": s.end_time,
                        "attributes": dict(s.attributes or {}),
                        "events": [{"name": e.name, "ns": e.timestamp} for e in s.events],
                    }
                )
            )
        with open(self._path, "a") as f:  # one write per batch: lines from two processes stay whole
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS


def configure_tracing(
    exporter: str | None = None,
    file_path: str | None = None,
    otlp_endpoint: str | None = None,
    otlp_protocol: str | None = None,
) -> str:
    """Attach the span exporter once per process; returns the exporter in use."""
    global _exporter_in_use
    with _configured:
        if _exporter_in_use is not None:
            return _exporter_in_use
        choice = (exporter or os.environ.get("OTEL_TRACES_EXPORTER") or "none").lower()
        if choice == "console":
            _provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif choice == "otlp":
            protocol = otlp_protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            # endpoint=None lets the exporter read the standard OTEL_EXPORTER_OTLP_* variables.
            exporter_ = OTLPSpanExporter(endpoint=otlp_endpoint)
            _provider.add_span_processor(BatchSpanProcessor(exporter_))
        elif choice == "file":
            if not file_path:
                raise ValueError("tracing exporter 'file' needs tracing.file_path")
            # Batched, off the event loop: a synchronous write per span would take the Router's
            # loop from its requests, most under a flood of refusals (a span each).
            _provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(file_path)))
        elif choice != "none":
            raise ValueError(f"unknown tracing exporter {choice!r}: otlp, console, file or none")
        _exporter_in_use = choice
        return choice


def current_trace_headers() -> dict[str, str]:
    """The current trace context as W3C headers, to hand to the next hop."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def context_from(headers: dict[str, str] | None) -> Context:
    return _propagator.extract(headers or {})


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else ""


def request_id_from(headers: dict[str, str]) -> str:
    """The `x-request-id` the request came with when it is sane, else a fresh one."""
    given = headers.get("x-request-id", "")
    return given if REQUEST_ID_RE.fullmatch(given) else str(uuid.uuid4())


class RequestIdentityMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request_id = request_id_from(headers)
        parent = _propagator.extract(headers)
        name = f"{scope['method']} {scope['path']}"
        with tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER) as span:
            carrier: dict[str, str] = {}
            _propagator.inject(carrier)
            scope.setdefault("state", {})["request_id"] = request_id
            extra = [(b"traceparent", carrier["traceparent"].encode())]
            if "x-request-id" not in headers:
                # Behind Ray Serve's proxy the header is always there (it makes one when the
                # client sent none) and the proxy echoes it as given; adding ours too would send
                # two. So add it only when served without the proxy. A malformed incoming id is
                # still replaced in `state.request_id`, which is what logs and traces use.
                extra.append((b"x-request-id", request_id.encode()))

            async def send_with_ids(message) -> None:
                if message["type"] == "http.response.start":
                    message = dict(message)
                    headers_out = list(message.get("headers", []))
                    present = {k.lower() for k, _ in headers_out}
                    # Headers a handler left in request.state.response_headers (rate limits,
                    # notes) go on every response, errors included, unless already set.
                    late = scope["state"].get("response_headers") or {}
                    headers_out += [
                        (k.lower().encode("latin-1"), str(v).encode("latin-1"))
                        for k, v in late.items()
                        if k.lower().encode("latin-1") not in present
                    ]
                    message["headers"] = headers_out + extra
                    span.set_attribute("http.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, send_with_ids)
