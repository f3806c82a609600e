"""The Router's admission gate (llmserve/router/admission_gate.py): rate limits and concurrency
caps.

No Ray, no vLLM: a Gate over a small AppConfig, with a fake clock that tests move by hand
(tests/unit/gate_helpers.py). The queue: test_gate_queue.py; replica counts, spans and
readiness: test_gate_replicas.py.
"""

from __future__ import annotations

import asyncio

import pytest

from llmserve.protocol.openai_protocol import OpenAIError
from tests.unit.gate_helpers import (
    LIMITED,
    MODEL,
    assert_idle,
    make_gate,
    refused,
    remaining,
    settle,
    spawn,
    state,
)

# ----------------------------------------------------------------------------- rate limits


async def test_over_the_request_rate_is_429_with_retry_after_and_ratelimit_headers():
    gate, tenants, clock = make_gate(LIMITED, max_ongoing_requests=10)
    t = tenants["t"]
    tickets = [await gate.admit(t, MODEL, 10, 60) for _ in range(2)]
    assert tickets[0].rate_headers["x-ratelimit-limit-requests"] == "2"
    assert tickets[1].rate_headers["x-ratelimit-remaining-requests"] == "0"

    e = await refused(gate.admit(t, MODEL, 10, 60))
    assert (e.status, e.code, e.type) == (429, "rate_limit_exceeded", "rate_limit_error")
    assert "requests" in e.message
    assert int(e.headers["Retry-After"]) >= 1
    for kind in ("requests", "tokens"):
        for name in ("limit", "remaining", "reset"):
            assert f"x-ratelimit-{name}-{kind}" in e.headers
    assert e.headers["x-ratelimit-limit-requests"] == "2"
    assert e.headers["x-ratelimit-limit-tokens"] == "600"
    assert e.headers["x-ratelimit-remaining-requests"] == "0"
    assert gate.num_rejected[(MODEL, "rate_limit")] == 1

    clock.now_s += 1.0  # one request's worth of refill
    tickets.append(await gate.admit(t, MODEL, 10, 60))
    for ticket in tickets:
        gate.finish(ticket, 10)
    assert_idle(gate)


@pytest.mark.parametrize(
    "rate_limits, first_tokens, second_tokens, limited_by",
    [
        ({"requests_per_s": 1, "max_burst_requests": 1}, 10, 10, "requests"),
        ({"tokens_per_min": 100}, 80, 30, "tokens"),
        (
            {"requests_per_s": 1, "max_burst_requests": 1, "tokens_per_min": 100},
            80,
            30,
            "requests and tokens",
        ),
    ],
)
async def test_a_refused_request_consumes_nothing(
    rate_limits, first_tokens, second_tokens, limited_by
):
    gate, tenants, clock = make_gate(
        {"name": "t", "rate_limits": rate_limits}, max_ongoing_requests=10
    )
    t = tenants["t"]
    ticket = await gate.admit(t, MODEL, first_tokens, 60)
    before = gate.rate_headers(t)
    for _ in range(3):
        e = await refused(gate.admit(t, MODEL, second_tokens, 60))
        assert e.status == 429 and f"for {limited_by} of" in e.message
        assert int(e.headers["Retry-After"]) >= 1
    assert gate.rate_headers(t) == before
    assert state(gate) == (1, 0)
    gate.finish(ticket, first_tokens)
    assert_idle(gate)


async def test_retry_after_is_the_time_until_the_tokens_are_back_rounded_up():
    gate, tenants, clock = make_gate(
        {"name": "t", "rate_limits": {"tokens_per_min": 60}}, max_ongoing_requests=10
    )
    t = tenants["t"]
    gate.finish(await gate.admit(t, MODEL, 60, 60), 60)  # empties the bucket: 1 token/s back
    e = await refused(gate.admit(t, MODEL, 5, 60))
    assert e.headers["Retry-After"] == "5"
    clock.now_s += 5
    gate.finish(await gate.admit(t, MODEL, 5, 60), 5)
    assert_idle(gate)


async def test_a_request_that_can_never_fit_is_400_not_429():
    gate, tenants, _ = make_gate({"name": "t", "rate_limits": {"tokens_per_min": 100}})
    e = await refused(gate.admit(tenants["t"], MODEL, 101, 60))
    assert (e.status, e.code, e.param) == (400, "request_too_large", "max_tokens")
    assert "Retry-After" not in e.headers
    assert remaining(gate, tenants["t"], "tokens") == 100
    assert_idle(gate)


async def test_unused_tokens_are_given_back_at_finish_and_overuse_is_charged():
    gate, tenants, _ = make_gate(
        {"name": "t", "rate_limits": {"tokens_per_min": 1000}}, max_ongoing_requests=10
    )
    t = tenants["t"]
    ticket = await gate.admit(t, MODEL, 300, 60)
    assert remaining(gate, t, "tokens") == 700
    gate.finish(ticket, 100)
    assert remaining(gate, t, "tokens") == 900
    ticket = await gate.admit(t, MODEL, 100, 60)
    assert remaining(gate, t, "tokens") == 800
    gate.finish(ticket, 400)  # used more than reserved (a low prompt estimate)
    assert remaining(gate, t, "tokens") == 500
    assert_idle(gate)


# ------------------------------------------------------------------------- concurrency cap


async def test_over_the_concurrency_cap_is_429_and_gives_the_tokens_back():
    gate, tenants, _ = make_gate(
        {"name": "t", "max_concurrent_requests": 2, "rate_limits": {"tokens_per_min": 1000}},
        max_ongoing_requests=10,
    )
    t = tenants["t"]
    first = [await gate.admit(t, MODEL, 100, 60) for _ in range(2)]
    assert remaining(gate, t, "tokens") == 800
    e = await refused(gate.admit(t, MODEL, 100, 60))
    assert (e.status, e.code) == (429, "concurrency_limit_exceeded")
    assert int(e.headers["Retry-After"]) >= 1
    assert remaining(gate, t, "tokens") == 800  # the refused request's reservation came back
    assert state(gate) == (2, 0)
    assert gate.num_rejected[(MODEL, "concurrency")] == 1

    gate.finish(first[0], 0)
    third = await gate.admit(t, MODEL, 100, 60)  # a unit is free again
    for ticket in (first[1], third):
        gate.finish(ticket, 0)
    assert_idle(gate)


async def test_the_concurrency_cap_is_per_tenant_and_counts_queued_requests():
    gate, tenants, _ = make_gate(
        {"name": "a", "max_concurrent_requests": 1}, {"name": "b"}, max_ongoing_requests=1
    )
    a, b = tenants["a"], tenants["b"]
    running = await gate.admit(b, MODEL, 10, 60)
    queued = spawn(gate, a)  # waits in the queue, holding a's one unit
    await settle()
    assert state(gate) == (1, 1)
    e = await refused(gate.admit(a, MODEL, 10, 60))
    assert e.status == 429 and e.code == "concurrency_limit_exceeded"
    other = spawn(gate, b)  # b is not capped
    await settle()
    assert state(gate) == (1, 2)
    gate.finish(running, 10)
    gate.finish(await queued, 10)
    gate.finish(await other, 10)
    assert_idle(gate)


@pytest.mark.parametrize(
    "rate_limits, num_admitted, precheck_refuses",
    [
        ({"requests_per_s": 1, "max_burst_requests": 2}, 2, True),  # the burst spent
        ({"requests_per_s": 1, "max_burst_requests": 2}, 1, False),
        ({"tokens_per_min": 10}, 5, False),  # a token limit is checked with the body, not before
        ({}, 50, False),  # unlimited
    ],
)
def test_the_request_rate_is_checked_before_the_body_taking_nothing(
    rate_limits, num_admitted, precheck_refuses
):
    gate, tenants, clock = make_gate(
        {"name": "t", "rate_limits": rate_limits}, max_ongoing_requests=100
    )
    t = tenants["t"]

    async def scenario():
        for _ in range(num_admitted):
            try:
                gate.finish(await gate.admit(t, MODEL, 1, 60.0), 0)
            except OpenAIError:
                pass
        before = gate.rate_headers(t)
        for _ in range(3):  # a precheck takes nothing: asking again changes nothing
            try:
                gate.precheck(t)
                refused = False
            except OpenAIError as e:
                assert (e.status, e.code) == (429, "rate_limit_exceeded")
                assert int(e.headers["Retry-After"]) >= 1
                refused = True
        assert gate.rate_headers(t) == before
        return refused

    assert asyncio.run(scenario()) is precheck_refuses
    assert gate.num_rejected[("unknown", "rate_limit")] == (3 if precheck_refuses else 0)
