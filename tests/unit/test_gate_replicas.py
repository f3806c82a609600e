"""The Router's admission gate (llmserve/router/admission_gate.py) as replicas come and go:
capacity from live replicas and Router replicas, its spans, and readiness. Rate limits and the
queue: test_admission_gate.py.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from llmserve.config.app_config import AppConfig
from llmserve.router.admission_gate import Gate
from tests.unit.gate_helpers import (
    LIMITED,
    MODEL,
    TENANTS,
    FakeClock,
    assert_idle,
    make_gate,
    refused,
    remaining,
    settle,
    spawn,
    state,
)

# -------------------------------------------------------------------- replicas and capacity


async def test_zero_live_replicas_queue_everything_until_one_comes_back():
    gate, tenants, _ = make_gate(*TENANTS, max_ongoing_requests=2)
    gate.set_live_replicas(MODEL, 0)
    assert gate.snapshot()[MODEL]["capacity"] == 0
    tasks = [
        spawn(gate, tenants["batch"]),
        spawn(gate, tenants["inter"]),
        spawn(gate, tenants["std"]),
    ]
    await settle()
    assert state(gate) == (0, 3) and not any(t.done() for t in tasks)
    gate.set_live_replicas(MODEL, 1)  # capacity 2: the two most urgent start
    await settle()
    assert [t.done() for t in tasks] == [False, True, True]
    assert state(gate) == (2, 1)
    gate.finish(tasks[1].result(), 10)
    await settle()
    assert tasks[0].done()
    for t in tasks[0], tasks[2]:
        gate.finish(t.result(), 10)
    assert_idle(gate)


async def test_batch_holds_its_share_of_the_engines_slots_as_replicas_come_and_go():
    # max_ongoing_requests 6 per replica (the engine's waiting line), max_num_seqs 4: batch's
    # half is of the 4 engine slots, not of the 6, so interactive work always finds one.
    gate, tenants, _ = make_gate(
        *TENANTS, max_ongoing_requests=6, max_num_seqs=4, batch_max_share=0.5
    )
    gate.set_live_replicas(MODEL, 1)
    batch = [spawn(gate, tenants["batch"]) for _ in range(4)]
    await settle()
    assert [t.done() for t in batch] == [True, True, False, False]
    inter = await gate.admit(tenants["inter"], MODEL, 10, 60)  # at once, beside batch's two
    gate.set_live_replicas(MODEL, 2)  # 8 engine slots: batch's share is 4
    await settle()
    assert all(t.done() for t in batch)
    for ticket in [inter, *(t.result() for t in batch)]:
        gate.finish(ticket, 10)
    assert_idle(gate)


async def test_shrinking_capacity_never_stops_running_requests():
    gate, tenants, _ = make_gate({"name": "t"}, max_ongoing_requests=2, num_replicas=2)
    t = tenants["t"]
    running = [await gate.admit(t, MODEL, 10, 60) for _ in range(4)]
    gate.set_live_replicas(MODEL, 1)
    waiter = spawn(gate, t)
    await settle()
    assert gate.snapshot()[MODEL] == {"capacity": 2, "in_flight": 4, "queued": 1}
    gate.finish(running[0], 10)
    gate.finish(running[1], 10)
    await settle()
    assert not waiter.done()  # in flight (2) is not below capacity (2) yet
    gate.finish(running[2], 10)
    await settle()
    assert waiter.done()
    gate.finish(running[3], 10)
    gate.finish(waiter.result(), 10)
    assert_idle(gate)


@pytest.mark.parametrize(
    "max_ongoing, num_replicas, num_router_replicas, expected",
    [
        (4, 1, 1, 4),
        (4, 1, 2, 2),
        (3, 1, 2, 2),  # ceil(1.5)
        (1, 1, 2, 1),  # ceil(0.5): every Router replica can start something
        (3, 3, 2, 5),  # ceil(4.5)
        (64, 2, 3, 43),  # ceil(42.67)
    ],
)
async def test_capacity_is_this_router_replicas_share_rounded_up(
    max_ongoing, num_replicas, num_router_replicas, expected
):
    gate, _, _ = make_gate(
        max_ongoing_requests=max_ongoing,
        num_replicas=num_replicas,
        num_router_replicas=num_router_replicas,
    )
    assert gate.snapshot()[MODEL]["capacity"] == expected
    gate.set_live_replicas(MODEL, 2 * num_replicas)
    assert gate.snapshot()[MODEL]["capacity"] == math.ceil(
        max_ongoing * 2 * num_replicas / num_router_replicas
    )


async def test_two_router_replicas_halve_the_request_rate_share():
    gate, tenants, clock = make_gate(
        {
            "name": "t",
            "rate_limits": {"requests_per_s": 2, "max_burst_requests": 4, "tokens_per_min": 1200},
        },
        max_ongoing_requests=10,
        num_router_replicas=2,
    )
    t = tenants["t"]
    first = await gate.admit(t, MODEL, 10, 60)
    assert first.rate_headers["x-ratelimit-limit-requests"] == "4"  # whole-app limits
    assert first.rate_headers["x-ratelimit-limit-tokens"] == "1200"
    assert first.rate_headers["x-ratelimit-remaining-requests"] == "2"  # 1 left / share 0.5
    second = await gate.admit(t, MODEL, 10, 60)  # this replica's burst share: 4 / 2 = 2
    e = await refused(gate.admit(t, MODEL, 10, 60))
    assert (e.status, e.code) == (429, "rate_limit_exceeded")
    assert e.headers["Retry-After"] == "1"  # refill at this replica's share: 1 request/s
    clock.now_s += 1.0
    third = await gate.admit(t, MODEL, 10, 60)
    e = await refused(gate.admit(t, MODEL, 10, 60))
    assert e.code == "rate_limit_exceeded"
    for ticket in (first, second, third):
        gate.finish(ticket, 10)
    assert_idle(gate)


@pytest.mark.parametrize(
    "cap, num_router_replicas, expected", [(3, 2, 2), (4, 2, 2), (1, 2, 1), (5, 1, 5)]
)
async def test_router_replicas_share_the_concurrency_cap_rounded_up(
    cap, num_router_replicas, expected
):
    gate, tenants, _ = make_gate(
        {"name": "t", "max_concurrent_requests": cap},
        max_ongoing_requests=10,
        num_router_replicas=num_router_replicas,
    )
    t = tenants["t"]
    held = [await gate.admit(t, MODEL, 10, 60) for _ in range(expected)]
    e = await refused(gate.admit(t, MODEL, 10, 60))
    assert e.code == "concurrency_limit_exceeded"
    for ticket in held:
        gate.finish(ticket, 10)
    assert_idle(gate)


async def test_two_router_replicas_halve_the_token_share():
    gate, tenants, _ = make_gate(
        {"name": "t", "rate_limits": {"tokens_per_min": 1000}},
        max_ongoing_requests=10,
        num_router_replicas=2,
    )
    t = tenants["t"]
    ticket = await gate.admit(t, MODEL, 400, 60)
    assert remaining(gate, t, "tokens") == 200  # (500 - 400) / share 0.5
    e = await refused(gate.admit(t, MODEL, 200, 60))
    assert e.status == 429 and "tokens" in e.message
    gate.finish(ticket, 400)
    assert_idle(gate)


async def test_priority_levels_come_from_the_config():
    gate, tenants, _ = make_gate(
        {"name": "gold", "priority": "gold"},
        {"name": "lead", "priority": "lead"},
        priority_levels={"gold": 5, "lead": 9},
    )
    assert gate.priority(tenants["gold"]) == 5
    assert gate.priority(tenants["lead"]) == 9


# ----------------------------------------------------------------------------------- spans


@pytest.fixture
def spans():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llmserve.observability import tracing

    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    tracing._provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()  # later spans no longer reach this exporter


async def test_rate_limit_and_queue_wait_are_separate_spans_of_one_trace(spans):
    gate, tenants, clock = make_gate(max_ongoing_requests=1)
    from llmserve.observability import tracing

    with tracing.tracer.start_as_current_span("request") as root:
        first = await gate.admit(tenants["t"], MODEL, 10, 60)
        waiting = spawn(gate, tenants["t"])
        await settle()
        clock.now_s += 2.5
        gate.finish(first, 10)
        second = await waiting
    got = [(s.name, s.parent.span_id if s.parent else None) for s in spans.get_finished_spans()]
    root_id = root.get_span_context().span_id
    assert got.count(("rate_limit", root_id)) == 2 and got.count(("queue_wait", root_id)) == 2
    waits = [
        s.attributes["llmserve.queue_wait_s"]
        for s in spans.get_finished_spans()
        if s.name == "queue_wait"
    ]
    assert sorted(waits) == [0.0, 2.5] == sorted([first.queue_wait_s, second.queue_wait_s])


async def test_a_rate_limited_request_ends_in_an_error_rate_limit_span_and_no_queue_span(spans):
    from opentelemetry.trace import StatusCode

    gate, tenants, _ = make_gate(LIMITED)
    for _ in range(2):
        gate.finish(await gate.admit(tenants["t"], MODEL, 10, 60), 10)
    spans.clear()
    await refused(gate.admit(tenants["t"], MODEL, 10, 60))
    [span] = spans.get_finished_spans()
    assert span.name == "rate_limit" and span.status.status_code == StatusCode.ERROR


# ------------------------------------------------------------------------------- readiness


def test_not_ready_until_every_model_has_a_running_replica():
    config = AppConfig.model_validate(
        {
            "models": [
                {"name": "a", "source": "org/a"},
                {"name": "b", "source": "org/b"},
                {
                    "name": "zero",
                    "source": "org/z",
                    "deployment": {"autoscaling": {"min_replicas": 0, "max_replicas": 2}},
                },
            ]
        }
    )
    gate = Gate(config, config.tenants, 1, clock=FakeClock())
    assert gate.not_ready() == {
        "a": "replica count not known yet",
        "b": "replica count not known yet",
    }
    gate.set_live_replicas("a", 1)
    gate.set_live_replicas("b", 0)
    assert gate.not_ready() == {"b": "no replica running"}
    gate.set_live_replicas("b", 2)
    # A model that may scale to zero is ready without replicas: its first request starts one.
    assert gate.not_ready() == {}
    gate.set_live_replicas("a", 0)  # a replica died and is being replaced
    assert gate.not_ready() == {"a": "no replica running"}


# ------------------------------------------------------------------------------ cold start


def cold_gate(replica_start_s: float = 30.0, min_replicas: int = 0):
    """A model scaled to zero whose replica takes `replica_start_s` to start; the wakes the
    gate asked for, in order."""
    config = AppConfig.model_validate(
        {
            "models": [
                {
                    "name": MODEL,
                    "source": "org/m",
                    "deployment": {
                        "autoscaling": {
                            "min_replicas": min_replicas,
                            "max_replicas": 1,
                            "replica_start_s": replica_start_s,
                        }
                    },
                }
            ],
            "tenants": [
                {"name": "std", "priority": "standard"},
                {"name": "b", "priority": "batch"},
            ],
            "admission": {"anonymous_tenant": None, "ttft_objective_s_by_class": {"standard": 2}},
        }
    )
    wakes: list[str] = []
    clock = FakeClock()
    gate = Gate(config, config.tenants, 1, clock=clock, wake=wakes.append)
    gate.set_live_replicas(MODEL, 0)
    return gate, {t.name: t for t in config.tenants}, clock, wakes


async def test_a_cold_start_that_breaks_the_promise_is_refused_at_once_and_begun():
    gate, tenants, clock, wakes = cold_gate()
    e = await refused(gate.admit(tenants["std"], MODEL, 10, 60))
    assert (e.status, e.code, e.headers["Retry-After"]) == (503, "cold_start", "30")
    assert wakes == [MODEL]  # the start begins though no request waits for it
    clock.now_s += 20
    e = await refused(gate.admit(tenants["std"], MODEL, 10, 60))
    assert e.headers["Retry-After"] == "10"  # what is left of the same start
    clock.now_s += 8.5
    # 1.5 s of the start left: within the 2 s promise, so it is held (let through to the
    # handle, where it waits for the replica).
    gate.finish(await gate.admit(tenants["std"], MODEL, 10, 60), 10)
    assert gate.num_rejected[(MODEL, "cold_start")] == 2


@pytest.mark.parametrize(("timeout_s", "held"), [(60, True), (10, False)])
async def test_a_class_without_a_promise_is_held_if_the_start_fits_its_deadline(timeout_s, held):
    gate, tenants, clock, wakes = cold_gate()
    if held:
        gate.finish(await gate.admit(tenants["b"], MODEL, 10, timeout_s), 10)
    else:
        assert (await refused(gate.admit(tenants["b"], MODEL, 10, timeout_s))).status == 503
    assert wakes == ([] if held else [MODEL])


async def test_with_a_replica_running_nothing_is_refused_for_a_start():
    gate, tenants, clock, wakes = cold_gate()
    await refused(gate.admit(tenants["std"], MODEL, 10, 60))
    gate.set_live_replicas(MODEL, 1)
    gate.finish(await gate.admit(tenants["std"], MODEL, 10, 60), 10)
    gate.set_live_replicas(MODEL, 0)  # scaled to zero again: a new start, from its first request
    clock.now_s += 100
    e = await refused(gate.admit(tenants["std"], MODEL, 10, 60))
    assert e.headers["Retry-After"] == "30" and wakes == [MODEL, MODEL]


async def test_a_model_that_never_scales_to_zero_is_never_refused_for_a_start():
    # A count of none there is a replica starting anyway, or the Router's count from before the
    # first one was up (seen: a 503 right after deploy): the request waits for it as before.
    gate, tenants, clock, wakes = cold_gate(min_replicas=1)
    pending = asyncio.ensure_future(gate.admit(tenants["std"], MODEL, 10, 60))
    await settle()
    gate.set_live_replicas(MODEL, 1)
    gate.finish(await pending, 10)
    assert wakes == [] and gate.num_rejected[(MODEL, "cold_start")] == 0
