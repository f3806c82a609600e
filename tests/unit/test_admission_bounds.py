"""The admission policy's bounds (llmserve/policies/admission.py): a full queue, the expected wait
and the time queued, each class against its own bound, and who gives way when the queue is full."""

from __future__ import annotations

import pytest

from llmserve.policies.admission import Admit, Queue, Reject
from tests.unit.test_admission import BATCH, INTERACTIVE, STANDARD, make


def test_queue_full_rejects_with_retry_after():
    policy = make(capacity=1, max_queue_len=2, min_retry_after_s=1.0)
    policy.offer("r", STANDARD, 0.0)
    policy.offer("q1", STANDARD, 0.0)
    policy.offer("q2", STANDARD, 0.0)
    decision = policy.offer("q3", STANDARD, 0.0)
    assert decision == Reject("q3", "queue_full", 1.0)  # no completion seen: the floor
    assert not policy.is_queued("q3") and not policy.is_in_flight("q3")


# capacity, max_queue_len, service times of earlier completions, queued, expected retry_after_s
RETRY_AFTER_CASES = {
    "no completions yet: min_retry_after_s": (2, 2, [], 2, 1.0),
    "queue / service rate": (2, 4, [10.0], 4, 20.0),
    "floored at min_retry_after_s": (8, 2, [0.1], 2, 1.0),
    "mean follows completions slowly": (1, 1, [10.0, 20.0], 1, 11.0),
}


@pytest.mark.parametrize(
    "capacity, max_queue_len, service_times_s, num_queued, retry_after_s",
    RETRY_AFTER_CASES.values(),
    ids=RETRY_AFTER_CASES,
)
def test_retry_after_estimates_time_to_work_off_the_queue(
    capacity, max_queue_len, service_times_s, num_queued, retry_after_s
):
    policy = make(capacity=capacity, max_queue_len=max_queue_len)
    now_s = 0.0
    for i, service_s in enumerate(service_times_s):
        policy.offer(f"done{i}", STANDARD, now_s)
        now_s += service_s
        policy.release(f"done{i}", now_s)
    for i in range(capacity):
        assert isinstance(policy.offer(f"run{i}", STANDARD, now_s), Admit)
    for i in range(num_queued):
        assert isinstance(policy.offer(f"q{i}", STANDARD, now_s), Queue)
    decision = policy.offer("late", STANDARD, now_s)
    assert decision == Reject("late", "queue_full", pytest.approx(retry_after_s))


def test_a_request_that_would_wait_too_long_is_refused_at_once():
    policy = make(capacity=1, max_queue_len=10, max_queue_wait_s=30.0)
    policy.offer("done", STANDARD, 0.0)
    policy.release("done", 10.0)  # one completion: 10 s a request
    assert isinstance(policy.offer("run", STANDARD, 10.0), Admit)
    for i in range(3):  # expected waits 10, 20 and 30 s: within the limit
        assert policy.offer(f"q{i}", STANDARD, 10.0) == Queue(f"q{i}")
    # 40 s expected: refused now rather than after 30 s in the queue.
    assert policy.offer("late", STANDARD, 10.0) == Reject("late", "queue_wait", 30.0)
    assert not policy.is_queued("late")
    # An interactive newcomer goes ahead of all three: 10 s expected, so it queues.
    assert policy.offer("urgent", INTERACTIVE, 10.0) == Queue("urgent")


def test_each_class_waits_up_to_its_own_bound():
    # Interactive work is refused after 2 s; batch work may wait its turn for 60.
    policy = make(capacity=1, max_queue_wait_s=2.0, max_queue_wait_s_by_level={BATCH: 60.0})
    assert policy.max_wait_s(INTERACTIVE) == 2.0 and policy.max_wait_s(BATCH) == 60.0
    policy.offer("done", STANDARD, 0.0)
    policy.release("done", 10.0)  # one completion: 10 s a request
    assert isinstance(policy.offer("run", STANDARD, 10.0), Admit)
    # Expected wait 10 s: past the 2 s bound for standard, within 60 s for batch.
    assert policy.offer("std", STANDARD, 10.0) == Reject("std", "queue_wait", 1.0)
    for i in range(6):  # 10 ... 60 s expected
        assert policy.offer(f"b{i}", BATCH, 10.0) == Queue(f"b{i}")
    # 70 s: refused, and told to come back within its class's bound, not the 2 s one.
    assert policy.offer("b6", BATCH, 10.0) == Reject("b6", "queue_wait", 60.0)
    assert policy.poll(69.0) == []
    assert [r.entry_id for r in policy.poll(70.5)] == [f"b{i}" for i in range(6)]


def test_poll_expires_each_class_at_its_own_bound():
    policy = make(capacity=0, max_queue_wait_s=5.0, max_queue_wait_s_by_level={BATCH: 20.0})
    policy.offer("b", BATCH, 0.0)
    policy.offer("s", STANDARD, 1.0)
    policy.offer("i", INTERACTIVE, 2.0)
    assert policy.poll(5.5) == []
    assert policy.poll(6.5) == [Reject("s", "queue_timeout", 5.0)]
    assert [r.entry_id for r in policy.poll(7.5)] == ["i"]
    assert policy.poll(20.0) == []
    assert policy.poll(20.5) == [Reject("b", "queue_timeout", 20.0)]
    assert policy.num_queued == 0


def test_zero_capacity_queues_and_says_to_wait_long():
    # No live replica yet (scale from zero): requests queue for the autoscaler to see.
    policy = make(capacity=0, max_queue_len=1, max_queue_wait_s=20.0)
    assert policy.offer("a", STANDARD, 0.0) == Queue("a")
    assert policy.offer("b", STANDARD, 0.0) == Reject("b", "queue_full", 20.0)
    assert policy.set_capacity(1, 5.0) == ["a"]


def test_zero_length_queue_rejects_whatever_cannot_start():
    policy = make(capacity=1, max_queue_len=0)
    assert policy.offer("a", INTERACTIVE, 0.0) == Admit("a")
    assert isinstance(policy.offer("b", INTERACTIVE, 0.0), Reject)


# (displace flag, queued priorities, newcomer priority, ageing_s, now_s, expected displaced id)
DISPLACE_CASES = {
    "interactive displaces the newest batch": (True, [BATCH, BATCH], INTERACTIVE, 0, 1.0, "q1"),
    "least urgent goes first": (True, [STANDARD, BATCH, STANDARD], INTERACTIVE, 0, 1.0, "q1"),
    "equal priority does not displace": (True, [STANDARD, STANDARD], STANDARD, 0, 1.0, None),
    "less urgent does not displace": (True, [INTERACTIVE], BATCH, 0, 1.0, None),
    "aged batch holds its place": (True, [BATCH], INTERACTIVE, 10.0, 25.0, None),
    "off when configured": (False, [BATCH, BATCH], INTERACTIVE, 0, 1.0, None),
}


@pytest.mark.parametrize(
    "displace, queued, newcomer, ageing_s, now_s, displaced",
    DISPLACE_CASES.values(),
    ids=DISPLACE_CASES,
)
def test_full_queue_makes_room_for_more_urgent(
    displace, queued, newcomer, ageing_s, now_s, displaced
):
    policy = make(
        capacity=1, max_queue_len=len(queued), ageing_s=ageing_s, displace_lower_priority=displace
    )
    policy.offer("r", STANDARD, 0.0)
    for i, priority in enumerate(queued):
        assert policy.offer(f"q{i}", priority, 0.0) == Queue(f"q{i}")
    decision = policy.offer("new", newcomer, now_s)
    if displaced is None:
        assert decision == Reject("new", "queue_full", 1.0)
    else:
        assert decision == Queue("new", Reject(displaced, "queue_full", 1.0))
        assert policy.is_queued("new") and not policy.is_queued(displaced)
        assert policy.num_queued == len(queued)


# (max_queue_wait_s, [(id, arrival_s, priority)], poll at, expired ids in order)
TIMEOUT_CASES = {
    "not yet at the bound": (10.0, [("a", 0.0, STANDARD)], 10.0, []),
    "just past the bound": (10.0, [("a", 0.0, STANDARD)], 10.001, ["a"]),
    "only the old ones": (10.0, [("a", 0.0, STANDARD), ("b", 5.0, STANDARD)], 12.0, ["a"]),
    "across priorities, oldest first": (
        10.0,
        [("b", 0.0, BATCH), ("i", 1.0, INTERACTIVE), ("s", 2.0, STANDARD), ("young", 9.0, BATCH)],
        15.0,
        ["b", "i", "s"],
    ),
}


@pytest.mark.parametrize(
    "max_queue_wait_s, arrivals, poll_s, expired", TIMEOUT_CASES.values(), ids=TIMEOUT_CASES
)
def test_poll_expires_entries_that_waited_too_long(max_queue_wait_s, arrivals, poll_s, expired):
    policy = make(capacity=1, max_queue_wait_s=max_queue_wait_s)
    policy.offer("r", STANDARD, 0.0)
    for entry_id, arrival_s, priority in arrivals:
        policy.offer(entry_id, priority, arrival_s)
    rejects = policy.poll(poll_s)
    assert [r.entry_id for r in rejects] == expired
    assert all(r.reason == "queue_timeout" and r.retry_after_s >= 1.0 for r in rejects)
    assert not any(policy.is_queued(e) for e in expired)
    assert policy.num_queued == len(arrivals) - len(expired)
    assert policy.poll(poll_s) == []  # each expires once
