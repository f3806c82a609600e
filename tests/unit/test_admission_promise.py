"""Admission by predicted first-token time (llmserve/policies/admission.py): a request of a
class with a first-token promise is refused at once when the engine slot it would get comes
after that promise, instead of being admitted into the engines' waiting line to miss it."""

from __future__ import annotations

from llmserve.policies.admission import Admit, Queue, Reject
from tests.unit.test_admission import BATCH, INTERACTIVE, STANDARD, make

# 4 engine slots behind 6 Router slots (1.5x: the engines' own waiting line); interactive
# promises its first token within 1 s, standard within 2 s; batch has only its queue bound.
OBJECTIVES = {INTERACTIVE: 1.0, STANDARD: 2.0}


def policy_with_service(service_s: float, **kw):
    policy = make(
        capacity=6, engine_slots=4, ttft_objective_s_by_level=OBJECTIVES, max_queue_len=10, **kw
    )
    policy.offer("warm", STANDARD, 0.0)
    policy.release("warm", service_s)  # one completion: the mean service time
    return policy


def test_a_free_engine_slot_admits_at_once_whatever_the_service_time():
    policy = policy_with_service(100.0)
    assert [policy.offer(f"s{i}", STANDARD, 100.0) for i in range(4)] == [
        Admit(f"s{i}") for i in range(4)
    ]


def test_a_promised_class_queues_only_for_a_slot_that_is_freeing():
    # 4 s a request on 4 slots, one started a second: an engine slot frees every second.
    policy = policy_with_service(4.0)
    for i in range(4):
        assert policy.offer(f"s{i}", STANDARD, 8.0 + i) == Admit(f"s{i}")
    # Engine slots all busy and none freed for 7 s (a load's onset: the mean service time may
    # be the idle one): not into the engine's line behind a running answer, nor into a queue
    # to time out there, but 503 now.
    for entry_id, priority in (("s4", STANDARD), ("i0", INTERACTIVE)):
        r = policy.offer(entry_id, priority, 11.0)
        assert isinstance(r, Reject) and r.reason == "queue_wait" and r.retry_after_s >= 1
    # Batch has no promise: it fills the engines' line behind them.
    assert policy.offer("b0", BATCH, 11.0) == Admit("b0")
    assert policy.release("s0", 12.0) == []
    assert policy.offer("s5", STANDARD, 12.0) == Admit("s5")  # the freed slot
    # Slots are freeing, one a second: it may wait for the next two.
    assert policy.offer("s6", STANDARD, 12.0) == Queue("s6")
    assert policy.offer("s7", STANDARD, 12.0) == Queue("s7")
    r = policy.offer("s8", STANDARD, 12.0)  # 3 s: past the next two
    assert isinstance(r, Reject) and r.reason == "queue_wait"
    assert policy.release("s1", 12.5) == ["s6"]


def test_unpromised_work_in_the_engines_line_does_not_hold_a_promised_class_back():
    policy = policy_with_service(4.0)
    assert [policy.offer(f"b{i}", BATCH, 4.0) for i in range(5)] == [
        Admit(f"b{i}") for i in range(5)
    ]
    # Batch holds the engines' slots and started all at once: the first slot frees in 4 s,
    # past the promise (a rate, 4 s / 4 slots, would say 1 s).
    r = policy.offer("s0", STANDARD, 4.0)
    assert isinstance(r, Reject) and r.reason == "queue_wait"
    # 3 s later the first ends in 1 s: the promised request goes to the engines, ahead of the
    # batch in their line (vLLM's priority order), not behind it.
    assert policy.offer("s1", STANDARD, 7.0) == Admit("s1")


def test_no_prediction_before_a_completion_or_without_the_engines_slots():
    policy = make(capacity=6, engine_slots=4, ttft_objective_s_by_level=OBJECTIVES)
    decisions = [type(policy.offer(f"s{i}", STANDARD, 0.0)) for i in range(7)]
    assert decisions == [Admit] * 4 + [Queue] * 3  # no estimate yet: past the slots, queued
    blind = make(capacity=2, ttft_objective_s_by_level=OBJECTIVES)
    blind.offer("w", STANDARD, 0.0)
    blind.release("w", 100.0)
    assert blind.offer("s0", STANDARD, 100.0) == Admit("s0")  # engines' slots unknown


def test_a_promised_class_queues_only_if_it_expects_to_start_within_half_its_bound():
    # 4 s a request on 2 slots, no engines' line known: a slot frees every 2 s. A wait near its
    # bound times out about half the time, a refusal that comes late instead of at once.
    policy = make(capacity=2, max_queue_wait_s=4.0, ttft_objective_s_by_level={STANDARD: 2.0})
    policy.offer("warm", STANDARD, 0.0)
    policy.release("warm", 4.0)
    assert [policy.offer(f"s{i}", STANDARD, 4.0) for i in range(2)] == [Admit("s0"), Admit("s1")]
    assert policy.offer("s2", STANDARD, 4.0) == Queue("s2")  # 2 s: half of 4 s
    r = policy.offer("s3", STANDARD, 4.0)  # 4 s: within the bound, not within half of it
    assert isinstance(r, Reject) and r.reason == "queue_wait"
    # A class without a promise queues up to its whole bound: 4 s, behind s2.
    assert policy.offer("other", 5, 4.0) == Queue("other")


def test_what_it_waited_in_front_of_the_router_counts_against_its_promise():
    """HAProxy's stamp (llmserve/router/request_path.py edge_wait_s): the client's first
    token is due `objective` after it reached the platform, not after it reached the Router."""
    policy = policy_with_service(4.0)
    for i in range(5):
        policy.offer(f"b{i}", BATCH, 4.0)
    # At 7 s the first batch slot frees in 1 s: within standard's 2 s, unless the request has
    # already spent 1.5 s reaching the Router.
    late = policy.offer("s0", STANDARD, 7.0, waited_s=1.5)
    assert isinstance(late, Reject) and late.reason == "queue_wait"
    assert policy.offer("s1", STANDARD, 7.0, waited_s=0.5) == Admit("s1")


def test_what_it_waited_in_front_of_the_router_counts_against_its_queue_bound():
    policy = make(capacity=1, max_queue_wait_s=10.0)
    assert policy.offer("run", BATCH, 0.0) == Admit("run")
    assert policy.offer("early", BATCH, 0.0, waited_s=6.0) == Queue("early")
    assert policy.offer("fresh", BATCH, 0.0) == Queue("fresh")
    # 5 s on: 11 s since the first reached the platform, 5 s for the other.
    assert [r.entry_id for r in policy.poll(5.0)] == ["early"]
    assert policy.release("run", 5.0) == ["fresh"]
