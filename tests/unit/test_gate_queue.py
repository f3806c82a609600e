"""The Router's admission gate (llmserve/router/admission_gate.py): its queue. Priorities, the
reserved share, a full queue, expiry (each class at its own bound), cancellation, and the
ticket's clock.

No Ray, no vLLM: a Gate with a fake clock (tests/unit/gate_helpers.py). Rate limits and
concurrency caps: test_admission_gate.py.
"""

from __future__ import annotations

import asyncio

import pytest

from llmserve.router.ticket import Ticket
from tests.unit.gate_helpers import (
    MODEL,
    TENANTS,
    assert_idle,
    make_gate,
    refused,
    remaining,
    settle,
    spawn,
    state,
)


async def test_batch_max_share_keeps_slots_for_interactive_requests():
    gate, tenants, _ = make_gate(*TENANTS, max_ongoing_requests=4, batch_max_share=0.5)
    batch = [spawn(gate, tenants["batch"]) for _ in range(4)]
    await settle()
    assert state(gate) == (2, 2)  # batch holds half the slots; two batch requests wait
    ticket = await asyncio.wait_for(gate.admit(tenants["inter"], MODEL, 10, 60), 1)
    assert state(gate) == (3, 2)  # the interactive request started at once
    gate.finish(ticket, 10)
    for done in [t for t in batch if t.done()]:
        gate.finish(done.result(), 10)
    await settle()
    assert state(gate) == (2, 0)  # the waiting batch requests took batch's two slots
    for t in batch:
        if not t.done() or not t.result().finished:
            gate.finish(await t, 10)
    assert_idle(gate)


async def test_an_interactive_request_queued_after_batch_ones_starts_first():
    gate, tenants, clock = make_gate(*TENANTS, max_ongoing_requests=1)
    running = await gate.admit(tenants["batch"], MODEL, 10, 60)
    order = [("b1", "batch"), ("b2", "batch"), ("s1", "std"), ("i1", "inter"), ("i2", "inter")]
    tasks = {}
    for name, tenant in order:
        clock.now_s += 0.1
        tasks[name] = spawn(gate, tenants[tenant])
        await settle()
    assert state(gate) == (1, 5)

    started = []
    while True:
        clock.now_s += 1.0
        gate.finish(running, 10)
        await settle()
        done = [name for name, task in tasks.items() if task.done() and name not in started]
        if not done:
            break
        assert len(done) == 1  # capacity 1: one at a time
        started.append(done[0])
        running = tasks[done[0]].result()
        assert state(gate) == (1, len(tasks) - len(started))
    assert started == ["i1", "i2", "s1", "b1", "b2"]
    assert isinstance(running, Ticket)
    # b2 arrived 0.3 s before the last arrival and started at the 5th finish, 1 s apart.
    assert tasks["b2"].result().queue_wait_s == pytest.approx(0.3 + 5.0)
    assert_idle(gate)


async def test_a_full_queue_is_503_with_retry_after():
    gate, tenants, _ = make_gate(*TENANTS, max_ongoing_requests=1, max_queue_len=2)
    running = await gate.admit(tenants["batch"], MODEL, 10, 60)
    waiting = [spawn(gate, tenants["std"]) for _ in range(2)]
    await settle()
    assert state(gate) == (1, 2)
    for tenant in ("std", "batch"):  # no more urgent than what waits: refused
        e = await refused(gate.admit(tenants[tenant], MODEL, 10, 60))
        assert (e.status, e.code, e.type) == (503, "queue_full", "service_unavailable_error")
        assert int(e.headers["Retry-After"]) >= 1
    assert gate.num_rejected[(MODEL, "queue_full")] == 2
    assert state(gate) == (1, 2)
    gate.finish(running, 10)
    for task in waiting:
        await settle()
        gate.finish(await task, 10)
    assert_idle(gate)


async def test_a_full_queue_displaces_its_least_urgent_entry_for_an_interactive_one():
    gate, tenants, _ = make_gate(*TENANTS, max_ongoing_requests=1, max_queue_len=2)
    running = await gate.admit(tenants["batch"], MODEL, 10, 60)
    older = spawn(gate, tenants["batch"])
    newer = spawn(gate, tenants["batch"])
    await settle()
    urgent = spawn(gate, tenants["inter"])
    await settle()
    e = await refused(newer)  # the newest batch entry makes room
    assert (e.status, e.code) == (503, "queue_full") and int(e.headers["Retry-After"]) >= 1
    assert not older.done() and state(gate) == (1, 2)
    gate.finish(running, 10)
    await settle()
    assert urgent.done() and not older.done()
    gate.finish(urgent.result(), 10)
    await settle()
    gate.finish(await older, 10)
    assert_idle(gate)


async def test_a_queued_request_past_its_timeout_gets_504_and_leaves_nothing_queued():
    gate, tenants, _ = make_gate({"name": "t", "rate_limits": {"tokens_per_min": 1000}})
    t = tenants["t"]
    running = await gate.admit(t, MODEL, 100, 60)
    # The deadline while queued runs on the event loop's timer: a short real timeout.
    e = await refused(gate.admit(t, MODEL, 100, timeout_s=0.01))
    assert (e.status, e.code, e.type) == (504, "deadline_exceeded", "timeout_error")
    assert gate.num_rejected[(MODEL, "deadline")] == 1
    assert state(gate) == (1, 0)
    assert remaining(gate, t, "tokens") == 900  # the timed-out reservation came back
    gate.finish(running, 100)
    assert_idle(gate)
    gate.finish(await gate.admit(t, MODEL, 100, 60), 100)  # the queue still works
    assert_idle(gate)


async def test_tick_expires_entries_queued_longer_than_max_queue_wait_s():
    gate, tenants, clock = make_gate(*TENANTS, max_ongoing_requests=1, max_queue_wait_s=5.0)
    running = await gate.admit(tenants["std"], MODEL, 10, 60)
    old = spawn(gate, tenants["batch"])
    await settle()
    clock.now_s += 3.0
    young = spawn(gate, tenants["batch"])
    await settle()
    clock.now_s += 2.5  # old waited 5.5 s, young 2.5 s
    gate.tick()
    e = await refused(old)
    assert (e.status, e.code) == (503, "queue_timeout") and int(e.headers["Retry-After"]) >= 1
    assert not young.done() and state(gate) == (1, 1)
    gate.finish(running, 10)
    await settle()
    gate.finish(await young, 10)
    assert_idle(gate)


async def test_batch_may_wait_longer_than_interactive_when_configured():
    gate, tenants, clock = make_gate(
        *TENANTS,
        max_ongoing_requests=1,
        max_queue_wait_s=2.0,
        max_queue_wait_s_by_class={"batch": 20.0},
    )
    running = await gate.admit(tenants["std"], MODEL, 10, 60)
    batch, inter = spawn(gate, tenants["batch"]), spawn(gate, tenants["inter"])
    await settle()
    clock.now_s += 3.0  # past the interactive bound, within the batch one
    gate.tick()
    e = await refused(inter)
    assert (e.status, e.code) == (503, "queue_timeout")
    assert not batch.done() and state(gate) == (1, 1)
    clock.now_s += 10.0
    gate.tick()
    gate.finish(running, 10)  # the batch request, 13 s in the queue, starts
    gate.finish(await batch, 10)
    assert_idle(gate)
    assert gate.num_rejected[(MODEL, "queue_timeout")] == 1


async def test_an_expired_entry_does_not_fill_the_queue_for_a_newcomer_between_ticks():
    gate, tenants, clock = make_gate(
        *TENANTS, max_ongoing_requests=1, max_queue_len=1, max_queue_wait_s=5.0
    )
    running = await gate.admit(tenants["std"], MODEL, 10, 60)
    stale = spawn(gate, tenants["batch"], timeout_s=2)  # real seconds: bounds a regression
    await settle()
    clock.now_s += 6.0  # stale is past max_queue_wait_s, but no tick() has run yet
    fresh = spawn(gate, tenants["batch"])
    await settle()
    e = await refused(stale)
    assert e.code == "queue_timeout"
    assert not fresh.done() and state(gate) == (1, 1)
    gate.finish(running, 10)
    await settle()
    gate.finish(await fresh, 10)
    assert_idle(gate)


async def test_a_cancelled_waiter_leaves_nothing_queued_or_in_flight():
    gate, tenants, _ = make_gate(
        {"name": "t", "max_concurrent_requests": 2, "rate_limits": {"tokens_per_min": 1000}}
    )
    t = tenants["t"]
    running = await gate.admit(t, MODEL, 100, 60)
    waiter = spawn(gate, t, num_tokens=100)
    await settle()
    assert state(gate) == (1, 1)
    waiter.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert state(gate) == (1, 0)
    assert remaining(gate, t, "tokens") == 900
    # Its concurrency unit is back: the tenant can queue another (cap 2).
    again = spawn(gate, t, num_tokens=100)
    await settle()
    assert state(gate) == (1, 1)
    gate.finish(running, 100)
    await settle()
    gate.finish(await again, 100)
    assert_idle(gate)


async def test_a_waiter_cancelled_right_after_its_slot_was_granted_gives_the_slot_on():
    gate, tenants, _ = make_gate(*TENANTS, max_ongoing_requests=1)
    running = await gate.admit(tenants["std"], MODEL, 10, 60)
    first = spawn(gate, tenants["std"])
    await settle()
    second = spawn(gate, tenants["std"])
    await settle()
    gate.finish(running, 10)  # grants first's future, but its task has not run yet
    first.cancel()
    try:
        ticket = await first
    except asyncio.CancelledError:
        ticket = None  # the slot went on to the next in line
    else:
        # Python 3.11's wait_for returns a result that is already there instead of
        # raising: then the caller holds the ticket and must finish it.
        assert state(gate) == (1, 1) and not second.done()
        gate.finish(ticket, 0)
    await settle()
    assert second.done()
    assert state(gate) == (1, 0)
    gate.finish(second.result(), 10)
    assert_idle(gate)


async def test_finish_twice_is_harmless():
    gate, tenants, _ = make_gate(
        {"name": "t", "max_concurrent_requests": 1, "rate_limits": {"tokens_per_min": 1000}}
    )
    t = tenants["t"]
    ticket = await gate.admit(t, MODEL, 100, 60)
    gate.finish(ticket, 50)
    gate.finish(ticket, 50)
    gate.finish(ticket, 0)
    assert ticket.finished
    assert_idle(gate)
    assert remaining(gate, t, "tokens") == 950  # settled once
    # The concurrency unit was given back once: the cap of 1 still holds.
    held = await gate.admit(t, MODEL, 10, 60)
    e = await refused(gate.admit(t, MODEL, 10, 60))
    assert e.code == "concurrency_limit_exceeded"
    gate.finish(held, 10)
    assert_idle(gate)


async def test_ticket_carries_the_deadline_and_the_queue_wait_on_the_gate_clock():
    gate, tenants, clock = make_gate({"name": "t"}, max_ongoing_requests=1)
    t = tenants["t"]
    running = await gate.admit(t, MODEL, 10, 30)
    assert running.deadline_s == clock.now_s + 30 and running.queue_wait_s == 0
    start_s = clock.now_s
    waiter = spawn(gate, t, timeout_s=20)
    await settle()
    clock.now_s += 4
    gate.finish(running, 10)
    ticket = await waiter
    assert ticket.deadline_s == start_s + 20
    assert ticket.queue_wait_s == 4
    assert (ticket.tenant, ticket.model, ticket.num_reserved_tokens) == ("t", MODEL, 10)
    gate.finish(ticket, 10)
    assert_idle(gate)
