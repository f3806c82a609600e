"""The Gate and the adaptive in-flight limit: streamed requests' first tokens move the model's
cap, the line to a first token refuses what would miss its promise, and none of it touches a
class without a promise or a non-streamed request."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.protocol.openai_protocol import OpenAIError
from tests.unit.gate_helpers import MODEL, assert_idle, make_gate, refused, settle

TENANTS = (
    {"name": "std", "priority": "standard"},
    {"name": "batch", "priority": "batch"},
)


def gate_with_promise(**admission):
    return make_gate(
        *TENANTS,
        max_ongoing_requests=10,
        max_num_seqs=8,
        **{"ttft_objective_s_by_class": {"standard": 2.0}, "min_in_flight": 2, **admission},
    )


async def admit(gate, tenant, streamed=True):
    return await gate.admit(tenant, MODEL, 10, 60, streamed=streamed)


def capacity(gate) -> int:
    return gate.snapshot()[MODEL]["capacity"]


async def test_the_cap_starts_at_the_engine_slots_a_miss_cuts_it_kept_promises_grow_it():
    gate, tenants, clock = gate_with_promise()
    # The engines' 8 slots, not the Router's 10: beyond them a request would wait in the
    # engine's own line, which no estimate sees at a load's onset.
    assert capacity(gate) == 8
    gate.set_live_replicas(MODEL, 0)  # the Router's first count, before the replica is up
    gate.set_live_replicas(MODEL, 1)
    assert capacity(gate) == 8
    tickets = [await admit(gate, tenants["std"]) for _ in range(8)]
    clock.now_s += 2.5
    gate.first_token(tickets[1], clock())  # 2.5 s for a 2 s promise, behind tickets[0]
    assert capacity(gate) == 6
    for t in tickets:
        gate.finish(t, 10)
    # Under the new cap, a first token well within the promise of the request that filled it:
    # one more a round, back to the engines' slots.
    for grown in (7, 8):
        clock.now_s += 0.1
        tickets = [await admit(gate, tenants["std"]) for _ in range(capacity(gate))]
        clock.now_s += 0.3
        gate.first_token(tickets[-1], clock())
        assert capacity(gate) == grown
        for t in tickets:
            gate.finish(t, 10)
    # Past them a promised class is refused, not sent to the engine's line, whatever the cap.
    tickets = [await admit(gate, tenants["std"]) for _ in range(8)]
    gate.first_token(tickets[-1], clock())
    assert capacity(gate) == 9
    clock.now_s += 5  # their answers near their end: a slot soon, but none free now
    e = await refused(admit(gate, tenants["std"]))
    assert e.status == 503 and e.code == "queue_wait"
    gate.finish(tickets[0], 10)
    tickets[0] = await admit(gate, tenants["std"])
    for t in tickets:
        gate.finish(t, 10)
    assert_idle(gate)


@pytest.mark.parametrize(
    ("num_streams", "cut_to"),
    [
        (2, 6),  # the second waited behind the first: the load's miss, cut on the tick
        (1, 8),  # a long prompt alone misses by its own prefill: nothing cut
    ],
)
async def test_a_stalled_first_token_cuts_the_cap_on_the_tick_only_behind_a_line(
    num_streams, cut_to
):
    gate, tenants, clock = gate_with_promise()
    tickets = [await admit(gate, tenants["std"]) for _ in range(num_streams)]
    clock.now_s += 1.9
    gate.tick()
    assert capacity(gate) == 8
    clock.now_s += 0.2
    gate.tick()
    assert capacity(gate) == cut_to
    gate.first_token(tickets[-1], clock.now_s + 2)
    assert capacity(gate) == cut_to
    for t in tickets:
        gate.finish(t, 10)
    assert_idle(gate)


@pytest.mark.parametrize(
    ("tenant", "streamed", "admission", "cap"),
    [
        ("batch", True, {}, 8),  # no promise: late, it missed nothing
        ("std", False, {}, 8),  # no first token the Router sees before the end
        ("std", True, {"adaptive_in_flight": False}, 10),  # off: the Router's cap, unmoved
        ("std", True, {"ttft_objective_s_by_class": {}}, 10),  # no promise to keep: the same
    ],
)
async def test_late_first_tokens_that_cut_nothing(tenant, streamed, admission, cap):
    gate, tenants, clock = gate_with_promise(**admission)
    assert capacity(gate) == cap
    promised = tenant == "std" and admission.get("ttft_objective_s_by_class") != {}
    num = min(cap, 8) if promised else cap  # a promised class fills the engine slots only
    tickets = [await admit(gate, tenants[tenant], streamed=streamed) for _ in range(num)]
    clock.now_s += 30
    gate.tick()
    for t in tickets:
        gate.first_token(t, clock())
    assert capacity(gate) == cap
    for t in tickets:
        gate.finish(t, 10)


async def test_a_batch_flood_s_fast_first_tokens_grow_the_cap_past_the_engine_slots():
    gate, tenants, clock = gate_with_promise()
    tickets = [await admit(gate, tenants["batch"]) for _ in range(8)]
    clock.now_s += 0.3  # within half the tightest promise (2 s): the engine has room
    gate.first_token(tickets[-1], clock())
    assert capacity(gate) == 9
    more = await admit(gate, tenants["batch"])
    clock.now_s += 1.5  # slow, but batch was promised nothing: no cut, no growth
    gate.first_token(more, clock())
    assert capacity(gate) == 9
    for t in [*tickets, more]:
        gate.finish(t, 10)
    assert_idle(gate)


async def test_a_line_to_the_first_token_longer_than_the_promise_is_refused_at_once():
    gate, tenants, clock = gate_with_promise()
    tickets = [await admit(gate, tenants["std"]) for _ in range(7)]
    clock.now_s += 0.1
    gate.first_token(tickets[0], clock())
    for t in tickets[1:4]:  # one first token every 0.55 s while a line waits
        clock.now_s += 0.55
        gate.first_token(t, clock())
    # Three still wait for theirs: a newcomer's would come after 4 x 0.55 s > 2 s.
    with pytest.raises(OpenAIError) as e:
        await admit(gate, tenants["std"])
    assert e.value.status == 503 and e.value.code == "queue_wait"
    assert e.value.headers["Retry-After"] == "1"  # 2.2 s - 2 s, at least a second
    assert gate.num_rejected[(MODEL, "queue_wait")] == 1
    # Batch has no promise to break: it is admitted as before.
    batch = await admit(gate, tenants["batch"])
    gate.first_token(tickets[4], clock.now_s + 0.1)  # two wait now: 3 x ~0.47 s fits
    clock.now_s += 0.1
    gate.finish(tickets[0], 10)  # a slot of the 8 (the batch request took the last)
    late = await admit(gate, tenants["std"])
    for t in [*tickets, batch, late]:
        gate.finish(t, 10)
    await settle()
    assert_idle(gate)


async def test_queued_requests_ahead_are_in_the_line_to_a_first_token():
    gate, tenants, clock = gate_with_promise(max_queue_wait_s=30)
    tickets = [await admit(gate, tenants["std"]) for _ in range(8)]  # the engines' 8 slots
    clock.now_s += 0.3
    gate.first_token(tickets[0], clock())
    for t in tickets[1:6]:  # one first token every 0.45 s while a line waits
        clock.now_s += 0.45
        gate.first_token(t, clock())
    # Two started ones wait for theirs. Newcomers queue (the slots are taken): the first is
    # third in line (1.35 s), the second fourth (1.8 s), the third fifth: 2.25 s > 2 s.
    queued = [asyncio.create_task(admit(gate, tenants["std"])) for _ in range(2)]
    await settle()
    assert gate.snapshot()[MODEL]["queued"] == 2
    e = await refused(admit(gate, tenants["std"]))
    assert e.status == 503 and e.code == "queue_wait"
    for t in tickets:
        gate.finish(t, 10)
    for t in await asyncio.gather(*queued):
        gate.finish(t, 10)
    assert_idle(gate)


async def test_the_queue_keeps_for_a_promise_what_the_engine_leaves_of_it():
    gate, tenants, clock = gate_with_promise(max_queue_wait_s=5)
    ticket = await admit(gate, tenants["std"])
    clock.now_s += 1.5  # the engine takes 1.5 s to a first token
    gate.first_token(ticket, clock())
    queue = gate._queues[MODEL]
    assert queue.max_wait_s(1) == pytest.approx(0.5)  # standard's 2 s less the engine's 1.5
    assert queue.max_wait_s(2) == 5  # batch: as configured
    gate.finish(ticket, 10)
