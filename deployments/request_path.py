"""Small pieces of the Router's request path that need no Router state: the stream in flight,
SSE frames, and reading a request's outcome and options.

Kept in their own module (importable, so pickled by reference) because @serve.ingress pickles the
Router's FastAPI app by value while deployments/router.py is still being imported.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from opentelemetry.trace import Span
from ray.serve.handle import DeploymentResponseGenerator
from sse_starlette import ServerSentEvent

from deployments.admission_gate import Ticket
from deployments.request_log import RequestTrail
from serve_app.openai_protocol import OpenAIError
from serve_app.openai_responses import ResponseBuilder


class OpenStream:
    """A generation whose first item has arrived (so errors surface as an HTTP status)."""

    def __init__(self, builder: ResponseBuilder, first, rest: DeploymentResponseGenerator,
                 usage: bool, ticket: Ticket, headers: dict[str, str],
                 trail: RequestTrail, span: Span) -> None:  # fmt: skip
        self.trail = trail
        self.span = span  # "stream": first token to the last, ended by the Router
        self.builder = builder
        self.first = first
        self.rest = rest
        self.include_usage = usage
        self.ticket = ticket
        self.headers = headers  # response headers: rate limits, clamping notes


def sse(data: dict[str, Any] | str, event: str | None = None) -> ServerSentEvent:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    # "\n" line ends, as OpenAI and vLLM send: an event carries its own separator (the
    # response's `sep` does not apply to it), and sse_starlette's default is "\r\n", which
    # clients that split frames on "\n\n" (vllm.benchmarks.serve among them) cannot parse.
    return ServerSentEvent(data=text, event=event, sep="\n")


def timeout_field(body: dict[str, Any]) -> float | None:
    value = body.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpenAIError(400, "timeout must be a number of seconds", param="timeout")
    return float(value)


def outcome_of(e: BaseException) -> tuple[str, str]:
    """(outcome, code) of a request that ended with `e`, for metrics and the access log."""
    if isinstance(e, OpenAIError):
        return str(e.status), e.code or ""
    if isinstance(e, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled", ""
    return "500", ""


def prompt_chars(gen) -> int:
    if gen.messages is not None:
        return sum(len(m["content"]) for m in gen.messages)
    return len(gen.prompt)
