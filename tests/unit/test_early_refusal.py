"""EarlyRefusal on the Router's own app shell: what the key alone decides is answered before
FastAPI routes or parses anything, with the same OpenAI-shaped error and headers."""

from __future__ import annotations

from fastapi import Request
from starlette.testclient import TestClient

from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.router.http_app import http_app, with_early_refusal

PATHS = frozenset({"/v1/completions"})


def make_client(refuse) -> tuple[TestClient, list[str]]:
    app = http_app()
    reached: list[str] = []

    @app.post("/v1/completions")
    async def completions(request: Request):
        reached.append(request.state.tenant)
        return {"tenant": request.state.tenant}

    @app.post("/v1/other")
    async def other():
        reached.append("other")
        return {}

    return TestClient(with_early_refusal(app, refuse, PATHS)), reached


def by_key(scope: dict) -> OpenAIError | None:
    state = scope.setdefault("state", {})
    key = dict(scope["headers"]).get(b"authorization")
    if key == b"Bearer good":
        state["tenant"] = "t1"
        state["response_headers"] = {"x-ratelimit-remaining-requests": "3"}
        return None
    if key == b"Bearer flood":
        state["response_headers"] = {"x-ratelimit-remaining-requests": "0"}
        return OpenAIError(
            429, "slow down", code="rate_limit_exceeded", headers={"Retry-After": "2"}
        )
    return OpenAIError(401, "who are you", code="invalid_api_key")


def test_a_refused_request_never_reaches_the_route_and_gets_the_openai_error():
    client, reached = make_client(by_key)
    # A body FastAPI could not even parse: the refusal comes first, as it must under a flood.
    r = client.post(
        "/v1/completions", content=b"{not json", headers={"authorization": "Bearer flood"}
    )
    assert r.status_code == 429
    assert r.json() == OpenAIError(429, "slow down", code="rate_limit_exceeded").body()
    assert r.headers["retry-after"] == "2"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"  # the state's headers, still added
    assert r.headers["x-request-id"] and r.headers["traceparent"]  # identity, as on any reply
    r = client.post("/v1/completions", json={}, headers={"authorization": "Bearer nope"})
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
    assert reached == []


def test_an_app_under_a_route_prefix_is_checked_on_its_own_paths():
    client, reached = make_client(by_key)
    client.app.root_path = "/sim"  # Serve mounts an app at its route_prefix this way
    r = client.post("/sim/v1/completions", json={}, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and reached == []


def test_an_admitted_request_reaches_the_route_with_its_tenant():
    client, reached = make_client(by_key)
    r = client.post("/v1/completions", json={}, headers={"authorization": "Bearer good"})
    assert (r.status_code, r.json()) == (200, {"tenant": "t1"})
    assert r.headers["x-ratelimit-remaining-requests"] == "3"
    assert reached == ["t1"]


def test_other_paths_and_methods_are_left_to_fastapi():
    calls: list[str] = []

    def refuse(scope):
        calls.append(scope["path"])
        return OpenAIError(401, "no")

    client, reached = make_client(refuse)
    assert client.post("/v1/other", json={}).status_code == 200
    assert client.get("/v1/completions").status_code == 405  # FastAPI's own answer
    assert client.post("/v1/missing", json={}).status_code == 404
    assert calls == [] and reached == ["other"]
