"""Reserved slots in the admission policy (llmserve/policies/admission.py): the capped class
(batch) holds at most its share of a model's slots, so the other classes start at once."""

from __future__ import annotations

import pytest

from llmserve.policies.admission import Admit, Queue
from tests.unit.test_admission import BATCH, INTERACTIVE, STANDARD, make


def test_batch_holds_at_most_its_share_and_interactive_starts_at_once():
    policy = make(capacity=4, capped_priority=BATCH, batch_max_share=0.5)
    decisions = {e: policy.offer(e, BATCH, 0.0) for e in ("b0", "b1", "b2", "b3")}
    assert [type(d) for d in decisions.values()] == [Admit, Admit, Queue, Queue]
    assert policy.offer("i0", INTERACTIVE, 1.0) == Admit("i0")  # a reserved slot, no wait
    assert policy.offer("s0", STANDARD, 1.0) == Admit("s0")
    assert isinstance(policy.offer("i1", INTERACTIVE, 2.0), Queue)  # all four slots busy
    assert policy.release("b0", 3.0) == ["i1"]  # the interactive request first
    assert policy.release("i0", 4.0) == ["b2"]  # batch holds one of its two: b2 may start
    assert policy.release("s0", 5.0) == []  # batch holds its two; b3 waits, a slot stays free
    assert policy.num_in_flight == 3 and policy.queued_in_order(5.0) == ["b3"]
    assert policy.offer("s1", STANDARD, 6.0) == Admit("s1")  # the free slot, past b3
    assert policy.release("b1", 7.0) == ["b3"]


def test_batch_keeps_at_least_one_slot():
    policy = make(capacity=1, capped_priority=BATCH, batch_max_share=0.5)
    assert policy.capped_limit == 1
    assert policy.offer("b0", BATCH, 0.0) == Admit("b0")


def test_ageing_does_not_lift_the_batch_share():
    policy = make(capacity=2, capped_priority=BATCH, batch_max_share=0.5, ageing_s=1.0)
    policy.offer("b0", BATCH, 0.0)
    policy.offer("b1", BATCH, 0.0)  # waits: batch holds its one slot
    assert policy.queued_in_order(100.0) == ["b1"]
    assert policy.offer("i0", INTERACTIVE, 100.0) == Admit("i0")  # b1 aged past it, still held


def test_batch_expected_wait_counts_its_share_of_the_slots():
    policy = make(capacity=4, max_queue_wait_s=15.0, capped_priority=BATCH, batch_max_share=0.25)
    for e in ("b0", "s0", "s1", "s2"):
        policy.offer(e, BATCH if e == "b0" else STANDARD, 0.0)
    policy.release("s0", 10.0)  # one completion: 10 s a request
    policy.offer("s3", STANDARD, 10.0)
    assert isinstance(policy.offer("b1", BATCH, 10.0), Queue)  # 1 x 10 s on its 1 slot
    # b2 has b1 ahead on batch's one slot: 20 s > 15 s, refused at once; a standard request
    # behind no one, on all four slots, would wait 2.5 s.
    assert policy.offer("b2", BATCH, 10.0).reason == "queue_wait"
    assert isinstance(policy.offer("s4", STANDARD, 10.0), Queue)


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_batch_share_must_be_a_share(share):
    with pytest.raises(ValueError, match="batch_max_share"):
        make(capped_priority=BATCH, batch_max_share=share)


# The shipped default model: max_num_seqs 32, max_ongoing_requests 48 (the engine's waiting
# line), batch_max_share 0.75. A share of the 48 let batch hold 36: every one of the engine's
# 32 slots, and an interactive request waited for a 256-token batch answer to end.
@pytest.mark.parametrize(
    ("capacity", "engine_slots", "share", "limit"),
    [
        (48, 32, 0.75, 24),  # 8 engine slots stay for the classes with a first-token promise
        (48, None, 0.75, 36),  # the engines' slots unknown: a share of the capacity
        (16, 32, 0.5, 8),  # fewer Router slots than engine slots: a share of the capacity
        (48, 32, 1.0, 48),  # no reservation: batch may fill the engines' waiting line too
        (1, 0, 0.75, 1),  # scaled to zero: the one request that wakes a replica
        (48, 1, 0.5, 1),  # at least one slot
    ],
)
def test_batch_share_is_of_the_engines_slots(capacity, engine_slots, share, limit):
    policy = make(
        capacity=capacity, capped_priority=BATCH, batch_max_share=share, engine_slots=engine_slots
    )
    assert policy.capped_limit == limit


def test_batch_never_holds_the_engines_last_slots_and_they_follow_the_replicas():
    policy = make(capacity=6, capped_priority=BATCH, batch_max_share=0.5, engine_slots=4)
    decisions = [policy.offer(f"b{i}", BATCH, 0.0) for i in range(4)]
    assert [type(d) for d in decisions] == [Admit, Admit, Queue, Queue]  # 2 of 4 engine slots
    assert policy.offer("i0", INTERACTIVE, 1.0) == Admit("i0")
    assert policy.offer("i1", INTERACTIVE, 1.0) == Admit("i1")  # the engine's last slot
    # A second replica: 8 engine slots, batch's share 4, the two queued start.
    assert policy.set_capacity(12, 2.0, engine_slots=8) == ["b2", "b3"]
    assert policy.capped_limit == 4


def test_engine_slots_must_not_be_negative():
    with pytest.raises(ValueError, match="engine_slots"):
        make(capped_priority=BATCH, batch_max_share=0.5, engine_slots=-1)
