"""Request identity: `x-request-id` and a W3C `traceparent` on every response.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which breaks client-disconnect
cancellation of streaming responses). The trace context comes from OpenTelemetry: an incoming
`traceparent` is continued, otherwise a new trace starts. Exporting spans is configured with the
standard OTEL_* environment variables by whoever sets up a TracerProvider; without one the ids are
still generated and returned so that a client can quote them.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_propagator = TraceContextTextMapPropagator()
_provider = TracerProvider()  # ids only; exporters are added where tracing is configured
tracer = _provider.get_tracer("llmserve.router")


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
