"""RequestIdentityMiddleware on a tiny Starlette app: x-request-id and W3C traceparent."""

from __future__ import annotations

import contextlib
import re
import uuid

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from llmserve.observability.tracing import RequestIdentityMiddleware, request_id_from

TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


async def whoami(request):
    return JSONResponse({"request_id": request.scope["state"]["request_id"]})


async def stream(request):
    async def gen():
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def fail(request):
    return JSONResponse(
        {"error": {"message": "nope"}}, status_code=503, headers={"Retry-After": "1"}
    )


def make_app(outer: list[Middleware] | None = None) -> Starlette:
    routes = [Route("/whoami", whoami), Route("/stream", stream), Route("/fail", fail)]
    middleware = (outer or []) + [Middleware(RequestIdentityMiddleware)]
    return Starlette(routes=routes, middleware=middleware)


@pytest.fixture(scope="module")
def client():
    with TestClient(make_app()) as c:
        yield c


def parse_traceparent(value: str) -> tuple[str, str, str]:
    m = TRACEPARENT_RE.match(value)
    assert m, f"not a W3C traceparent: {value!r}"
    trace_id, span_id, flags = m.groups()
    assert trace_id != "0" * 32 and span_id != "0" * 16
    return trace_id, span_id, flags


# ------------------------------------------------------------------------------- traceparent


@pytest.mark.parametrize(
    "path, status", [("/whoami", 200), ("/stream", 200), ("/fail", 503), ("/no-such-route", 404)]
)
def test_every_response_has_one_valid_traceparent(client, path, status):
    r = client.get(path)
    assert r.status_code == status
    values = r.headers.get_list("traceparent")
    assert len(values) == 1
    parse_traceparent(values[0])


def test_each_request_without_traceparent_starts_a_new_trace(client):
    ids = {parse_traceparent(client.get("/whoami").headers["traceparent"])[0] for _ in range(3)}
    assert len(ids) == 3


@pytest.mark.parametrize("flags", ["01", "00"])
def test_incoming_traceparent_is_continued(client, flags):
    r = client.get("/whoami", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-{flags}"})
    trace_id, span_id, out_flags = parse_traceparent(r.headers["traceparent"])
    assert trace_id == TRACE_ID
    assert span_id != PARENT_SPAN  # our server span is a child, not the caller's span
    assert out_flags == flags


@pytest.mark.parametrize(
    "incoming",
    [
        "garbage",
        f"00-{'0' * 32}-{PARENT_SPAN}-01",  # all-zero trace id is invalid
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero span id is invalid
        f"00-{TRACE_ID[:-1]}-{PARENT_SPAN}-01",  # too short
        f"ff-{TRACE_ID}-{PARENT_SPAN}-01",  # forbidden version
    ],
)
def test_malformed_incoming_traceparent_starts_a_fresh_trace(client, incoming):
    r = client.get("/whoami", headers={"traceparent": incoming})
    assert r.status_code == 200
    trace_id, _, _ = parse_traceparent(r.headers["traceparent"])
    assert trace_id not in (TRACE_ID, "0" * 32)


# ------------------------------------------------------------------------------ x-request-id


def test_request_without_id_gets_one(client):
    r = client.get("/whoami")
    values = r.headers.get_list("x-request-id")
    assert len(values) == 1
    assert uuid.UUID(values[0])
    assert r.json()["request_id"] == values[0]  # the app sees the id the client is told


def test_ids_differ_between_requests(client):
    assert (
        client.get("/whoami").headers["x-request-id"]
        != client.get("/whoami").headers["x-request-id"]
    )


def test_streaming_and_error_responses_get_an_id_too(client):
    for path in ("/stream", "/fail", "/no-such-route"):
        assert len(client.get(path).headers.get_list("x-request-id")) == 1, path
    r = client.get("/fail")
    assert r.headers["retry-after"] == "1"  # the app's own headers are kept


@pytest.mark.parametrize("given", ["my-req-123", "a.b:c_d-E", "x" * 128])
def test_valid_incoming_id_is_kept_and_not_added_again(client, given):
    r = client.get("/whoami", headers={"x-request-id": given})
    assert r.json()["request_id"] == given
    # Served directly, nothing is added: Ray Serve's proxy echoes the client's header itself,
    # so adding it here would duplicate it (see the behind-the-proxy test below).
    assert r.headers.get_list("x-request-id") == []


@pytest.mark.parametrize(
    "given",
    [b"", b"has space", b"x" * 129, b"<script>", b"semi;colon", b"caf\xe9", b"a,b"],
)
def test_malformed_incoming_id_is_replaced_internally(client, given):
    r = client.get("/whoami", headers=[(b"x-request-id", given)])
    # Logs and traces use a fresh id; the header itself is left to Ray's proxy, which echoes
    # what the client sent, so that a response never carries two x-request-id headers.
    assert uuid.UUID(r.json()["request_id"])
    assert r.headers.get_list("x-request-id") == []


@pytest.mark.parametrize(
    "headers, kept",
    [
        ({"x-request-id": "abc"}, True),
        ({"x-request-id": "abc\n"}, False),  # a trailing newline must not slip through
        ({"x-request-id": "abc\r\nx-evil: 1"}, False),
        ({"x-request-id": "ab cd"}, False),
        ({"x-request-id": ""}, False),
        ({}, False),
    ],
)
def test_request_id_from(headers, kept):
    rid = request_id_from(headers)
    if kept:
        assert rid == headers["x-request-id"]
    else:
        assert uuid.UUID(rid) and rid != headers.get("x-request-id")


# ------------------------------------------------------------------ behind Ray Serve's proxy


def ray_request_id_middleware():
    # The middleware Ray Serve's HTTP proxy always applies first (echoes or creates the id).
    from ray.serve._private.http_util import RequestIdMiddleware

    return Middleware(RequestIdMiddleware)


@pytest.mark.parametrize("given", [None, "client-id-1"])
def test_behind_ray_proxy_exactly_one_request_id(given):
    c = TestClient(make_app(outer=[ray_request_id_middleware()]))  # no lifespan: as in the proxy
    r = c.get("/whoami", headers={"x-request-id": given} if given else {})
    values = r.headers.get_list("x-request-id")
    assert len(values) == 1
    assert r.json()["request_id"] == values[0]
    if given:
        assert values[0] == given


def test_lifespan_still_reaches_the_app():
    started = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        started.append(True)
        yield

    app = Starlette(
        routes=[Route("/whoami", whoami)],
        lifespan=lifespan,
        middleware=[Middleware(RequestIdentityMiddleware)],
    )
    with TestClient(app) as c:
        assert c.get("/whoami").status_code == 200
    assert started == [True]


def test_file_exporter_writes_each_span_with_its_events(tmp_path):
    """The file exporter's lines carry the span's events (the replica's `first_token`), so a
    one-stream latency can be split by span from the file alone (docs/benchmarks.md)."""
    import json

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from llmserve.observability.tracing import JsonLinesSpanExporter

    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(str(path))))
    with provider.get_tracer("t").start_as_current_span("llmserver.generate") as span:
        span.add_event("first_token")
    (line,) = path.read_text().splitlines()
    written = json.loads(line)
    assert written["name"] == "llmserver.generate"
    assert [e["name"] for e in written["events"]] == ["first_token"]
    assert written["start_ns"] <= written["events"][0]["ns"] <= written["end_ns"]
