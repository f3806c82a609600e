"""Preemption (llmserve/policies/admission.py): a request of a class with a first-token promise
that would wait, or miss its promise, takes the slot of a preemptible in-flight request of a
lower class, which waits in the queue again and goes on when it starts."""

from __future__ import annotations

from llmserve.policies.admission import Admit, Queue, Reject
from tests.unit.test_admission import BATCH, INTERACTIVE, STANDARD, make

OBJECTIVES = {INTERACTIVE: 1.0, STANDARD: 2.0}


def full(preemptible: dict[str, int], capacity: int = 2):
    """Every slot held, by the given entries (id -> priority), admitted in that order; those
    whose id starts with "p" are preemptible (tracked streams)."""
    policy = make(capacity=capacity, engine_slots=capacity, ttft_objective_s_by_level=OBJECTIVES)
    for t, (entry_id, priority) in enumerate(preemptible.items()):
        assert policy.offer(entry_id, priority, float(t)) == Admit(entry_id)
        if entry_id.startswith("p"):
            policy.mark_preemptible(entry_id, priority)
    return policy


def test_a_promised_request_takes_the_slot_of_the_longest_running_batch_stream():
    policy = full({"p-old": BATCH, "p-new": BATCH})
    assert policy.offer("i", INTERACTIVE, 10.0) == Admit("i", preempted="p-old")
    assert policy.is_queued("p-old") and not policy.is_in_flight("p-old")
    assert policy.num_in_flight == 2
    # It goes on as soon as a slot frees, before any batch request that came after it.
    assert isinstance(policy.offer("b-later", BATCH, 11.0), Queue)
    assert policy.release("i", 12.0) == ["p-old"]


def test_the_lowest_class_goes_first_and_never_one_of_the_newcomer_s_own():
    policy = full({"p-batch": BATCH, "p-std": STANDARD})
    assert policy.offer("i", INTERACTIVE, 10.0) == Admit("i", preempted="p-batch")
    assert policy.offer("s", STANDARD, 10.0) == Queue("s")  # p-std is its own class
    assert policy.offer("i2", INTERACTIVE, 10.0) == Admit("i2", preempted="p-std")
    assert policy.offer("i3", INTERACTIVE, 10.0) == Queue("i3")  # only interactive left


def test_nothing_is_preempted_for_a_class_without_a_promise_or_that_cannot_resume():
    policy = full({"p-batch": BATCH, "x-plain": BATCH})
    assert policy.offer("b", BATCH, 10.0) == Queue("b")  # batch promises no first token
    policy = full({"x-batch": BATCH, "x-plain": BATCH})  # neither preemptible
    assert policy.offer("i", INTERACTIVE, 10.0) == Queue("i")


def test_a_request_that_would_miss_its_promise_preempts_rather_than_being_refused():
    # 4 s a request on 2 slots, both taken and one more in the engines' line: 2 x 4 s / 2.
    policy = make(capacity=3, engine_slots=2, ttft_objective_s_by_level=OBJECTIVES)
    policy.offer("w", STANDARD, 0.0)
    policy.release("w", 4.0)
    for entry_id in ("p0", "p1", "p2"):
        policy.offer(entry_id, BATCH, 4.0)
    assert isinstance(policy.offer("i", INTERACTIVE, 4.0), Reject)  # none preemptible yet
    policy.mark_preemptible("p0", BATCH)
    assert policy.offer("i", INTERACTIVE, 4.0) == Admit("i", preempted="p0")


def test_a_released_or_preempted_entry_is_no_longer_preemptible():
    policy = full({"p0": BATCH, "p1": BATCH})
    policy.release("p0", 5.0)
    assert policy.offer("s", STANDARD, 5.0) == Admit("s")  # the free slot, no preemption
    assert policy.offer("i", INTERACTIVE, 6.0) == Admit("i", preempted="p1")
    # p1 is queued, not in flight: nothing left to preempt (refused: the line is long).
    assert isinstance(policy.offer("i2", INTERACTIVE, 6.0), Reject)
    assert policy.cancel("p1")  # its client left while it waited to go on
