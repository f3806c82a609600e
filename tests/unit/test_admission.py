"""Per-model admission: in-flight cap and bounded priority queue, with a plain-float clock."""

from __future__ import annotations

import random

import pytest

from llmserve.policies.admission import (
    DEFAULT_PRIORITY_LEVELS,
    AdmissionPolicy,
    Admit,
    Queue,
    Reject,
)

INTERACTIVE = DEFAULT_PRIORITY_LEVELS["interactive"]
STANDARD = DEFAULT_PRIORITY_LEVELS["standard"]
BATCH = DEFAULT_PRIORITY_LEVELS["batch"]


def make(capacity=1, max_queue_len=10, max_queue_wait_s=30.0, **kwargs) -> AdmissionPolicy:
    return AdmissionPolicy(
        capacity=capacity, max_queue_len=max_queue_len, max_queue_wait_s=max_queue_wait_s, **kwargs
    )


def drain_order(policy: AdmissionPolicy, first_in_flight: str, now_s: float) -> list[str]:
    """Release one request at a time (capacity 1) and return the order they start in."""
    order, running = [], first_in_flight
    while True:
        started = policy.release(running, now_s)
        if not started:
            return order
        assert len(started) == 1
        running = started[0]
        order.append(running)


# -- ordering -------------------------------------------------------------------------

# [(id, priority, arrival_s)] queued behind one running request -> start order
ORDER_CASES = {
    "priority first": (
        [("b", BATCH, 1.0), ("s", STANDARD, 2.0), ("i", INTERACTIVE, 3.0)],
        ["i", "s", "b"],
    ),
    "arrival within a priority": (
        [("s1", STANDARD, 1.0), ("s2", STANDARD, 2.0), ("s3", STANDARD, 3.0)],
        ["s1", "s2", "s3"],
    ),
    "mixed": (
        [
            ("b1", BATCH, 0.1),
            ("i1", INTERACTIVE, 0.2),
            ("b2", BATCH, 0.3),
            ("i2", INTERACTIVE, 0.4),
            ("s1", STANDARD, 0.5),
        ],
        ["i1", "i2", "s1", "b1", "b2"],
    ),
    "same clock reading keeps arrival order": (
        [("x", STANDARD, 5.0), ("y", STANDARD, 5.0), ("z", STANDARD, 5.0)],
        ["x", "y", "z"],
    ),
    "custom numeric levels": (
        [("low", 20, 1.0), ("high", -5, 2.0), ("mid", 10, 3.0)],
        ["high", "mid", "low"],
    ),
}


@pytest.mark.parametrize("arrivals, expected", ORDER_CASES.values(), ids=ORDER_CASES)
def test_queue_orders_by_priority_then_arrival(arrivals, expected):
    policy = make(capacity=1)
    assert policy.offer("running", STANDARD, 0.0) == Admit("running")
    for entry_id, priority, arrival_s in arrivals:
        assert policy.offer(entry_id, priority, arrival_s) == Queue(entry_id)
    assert policy.queued_in_order(6.0) == expected
    assert drain_order(policy, "running", 6.0) == expected


def test_release_starts_in_order_as_many_as_slots_free():
    policy = make(capacity=2)
    for entry_id in ("r1", "r2"):
        assert policy.offer(entry_id, STANDARD, 0.0) == Admit(entry_id)
    for entry_id, priority in [("b", BATCH), ("s", STANDARD), ("i", INTERACTIVE)]:
        policy.offer(entry_id, priority, 1.0)
    assert policy.release("r1", 2.0) == ["i"]
    assert policy.set_capacity(4, 2.0) == ["s", "b"]  # a new replica came up
    assert policy.num_in_flight == 4 and policy.num_queued == 0
    assert policy.offer("n", STANDARD, 3.0) == Queue("n")
    assert policy.release("r2", 4.0) == ["n"]
    assert policy.release("i", 4.0) == []


# -- ageing ------------------------------------------------------------------------------

# (ageing_s, interactive arrives at, release at, who starts first)
AGEING_CASES = {
    "off: interactive always first": (0.0, 1000.0, 5000.0, "interactive"),
    "one level gained is not enough": (10.0, 15.0, 19.99, "interactive"),
    "two levels gained: older batch passes": (10.0, 15.0, 20.0, "batch"),
    "interactive also ages, so batch needs its lead": (10.0, 5.0, 20.0, "interactive"),
    "long wait": (1.0, 100.0, 101.0, "batch"),
}


@pytest.mark.parametrize(
    "ageing_s, interactive_s, release_s, first", AGEING_CASES.values(), ids=AGEING_CASES
)
def test_ageing_lets_old_batch_pass_newer_interactive(ageing_s, interactive_s, release_s, first):
    policy = make(capacity=1, max_queue_wait_s=10_000.0, ageing_s=ageing_s)
    policy.offer("r", STANDARD, 0.0)
    policy.offer("batch", BATCH, 0.0)
    policy.offer("interactive", INTERACTIVE, interactive_s)
    assert policy.release("r", release_s) == [first]


@pytest.mark.parametrize(
    "priority, waited_s, ageing_s, effective",
    [
        (2, 0.0, 10.0, 2),
        (2, 9.99, 10.0, 2),
        (2, 10.0, 10.0, 1),
        (2, 25.0, 10.0, 0),
        (2, 35.0, 10.0, -1),
        (2, 1e6, 0.0, 2),
        (0, -5.0, 10.0, 0),
    ],
)
def test_effective_priority(priority, waited_s, ageing_s, effective):
    assert make(ageing_s=ageing_s).effective_priority(priority, waited_s) == effective


# -- cancel, capacity changes, misuse ----------------------------------------------------------


def test_cancel_removes_only_queued_entries():
    policy = make(capacity=1)
    policy.offer("r", STANDARD, 0.0)
    policy.offer("a", STANDARD, 1.0)
    policy.offer("b", STANDARD, 2.0)
    assert policy.cancel("a") is True
    assert policy.cancel("a") is False  # already gone
    assert policy.cancel("r") is False  # running: the caller releases it instead
    assert policy.cancel("never") is False
    assert policy.release("r", 3.0) == ["b"]
    assert policy.poll(1000.0) == []


def test_capacity_shrink_admits_nothing_until_in_flight_drops_below():
    policy = make(capacity=4)
    for i in range(4):
        assert policy.offer(f"r{i}", STANDARD, 0.0) == Admit(f"r{i}")
    assert policy.set_capacity(2, 1.0) == []  # two replicas died; running work goes on
    assert policy.offer("q", STANDARD, 1.0) == Queue("q")
    assert policy.release("r0", 2.0) == []  # 3 in flight, capacity 2
    assert policy.release("r1", 2.0) == []  # 2 in flight: still full
    assert policy.release("r2", 2.0) == ["q"]
    assert policy.num_in_flight == 2


def test_misuse_is_loud():
    policy = make(capacity=1)
    policy.offer("a", STANDARD, 0.0)
    policy.offer("b", STANDARD, 0.0)
    for entry_id in ("a", "b"):
        with pytest.raises(ValueError):
            policy.offer(entry_id, STANDARD, 1.0)
    with pytest.raises(KeyError):
        policy.release("b", 1.0)  # queued, not running
    policy.release("a", 1.0)
    with pytest.raises(KeyError):
        policy.release("a", 1.0)  # double release


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(capacity=-1),
        dict(max_queue_len=-1),
        dict(max_queue_wait_s=0),
        dict(max_queue_wait_s=float("inf")),
        dict(ageing_s=-1),
        dict(min_retry_after_s=-1),
        dict(max_queue_wait_s_by_level={BATCH: 0}),
        dict(max_queue_wait_s_by_level={BATCH: float("nan")}),
    ],
)
def test_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        make(**kwargs)


# -- randomised invariants ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_random_sequences_keep_invariants(seed):
    rng = random.Random(seed)
    capped = seed % 2 == 1  # half the runs reserve slots: batch holds a share at most
    policy = make(
        capacity=rng.randint(0, 4),
        max_queue_len=rng.randint(0, 6),
        max_queue_wait_s=rng.uniform(1, 20),
        ageing_s=rng.choice([0.0, 0.5, 3.0]),
        max_queue_wait_s_by_level={
            p: rng.uniform(1, 40) for p in rng.sample([0, 1, 2], rng.randint(0, 2))
        },
        displace_lower_priority=rng.random() < 0.5,
        capped_priority=BATCH if capped else None,
        batch_max_share=rng.choice([0.34, 0.5, 0.75]) if capped else 1.0,
    )
    priority: dict[str, int] = {}
    offered: list[str] = []
    arrival: dict[str, float] = {}
    outcome: dict[str, str] = {}  # id -> "admitted" | "rejected" | "cancelled", set once
    running: set[str] = set()
    now_s = 0.0

    def settle(entry_id: str, fate: str) -> None:
        assert entry_id not in outcome, f"{entry_id} decided twice"
        outcome[entry_id] = fate

    def running_batch() -> int:
        return sum(1 for e in running if priority[e] == BATCH)

    def start(entry_id: str) -> None:
        settle(entry_id, "admitted")
        running.add(entry_id)
        if capped and priority[entry_id] == BATCH:
            assert running_batch() <= policy.capped_limit

    def started(ids: list[str], expected_order: list[str]) -> None:
        if capped:  # the most urgent of those allowed start, in order; batch may be skipped
            assert ids == [e for e in expected_order if e in ids]
            skipped = expected_order[: expected_order.index(ids[-1])] if ids else []
            assert all(priority[e] == BATCH for e in skipped if e not in ids)
        else:
            assert ids == expected_order[: len(ids)]  # the most urgent start, in order
        for entry_id in ids:
            start(entry_id)
        if ids:
            assert policy.num_in_flight <= policy.capacity

    for step in range(400):
        now_s += rng.expovariate(2.0)
        op = rng.random()
        order = policy.queued_in_order(now_s)
        if op < 0.45:
            entry_id = f"e{step}"
            offered.append(entry_id)
            priority[entry_id] = rng.choice([0, 1, 2])
            arrival[entry_id] = now_s
            decision = policy.offer(entry_id, priority[entry_id], now_s)
            if isinstance(decision, Admit):
                assert policy.num_in_flight <= policy.capacity
                start(entry_id)
            elif isinstance(decision, Reject):
                assert decision.retry_after_s > 0
                settle(entry_id, "rejected")
            elif decision.displaced is not None:
                settle(decision.displaced.entry_id, "rejected")
        elif op < 0.75 and running:
            entry_id = rng.choice(sorted(running))
            running.remove(entry_id)
            started(policy.release(entry_id, now_s), order)
        elif op < 0.85 and order:
            entry_id = rng.choice(order)
            assert policy.cancel(entry_id)
            settle(entry_id, "cancelled")
        elif op < 0.95:
            for reject in policy.poll(now_s):
                waited_s = now_s - arrival[reject.entry_id]
                assert waited_s > policy.max_wait_s(priority[reject.entry_id])
                settle(reject.entry_id, "rejected")
            # What is left has waited no longer than its class allows.
            assert all(
                now_s - arrival[e] <= policy.max_wait_s(priority[e])
                for e in policy.queued_in_order(now_s)
            )
        else:
            started(policy.set_capacity(rng.randint(0, 4), now_s), order)

        queued = set(policy.queued_in_order(now_s))
        assert queued.isdisjoint(running)
        assert all(policy.is_in_flight(e) for e in running)
        assert policy.num_in_flight == len(running)
        assert policy.num_queued == len(queued) <= 6
        assert sum(policy.num_queued_by_level().values()) == len(queued)
        if queued and policy.num_in_flight < policy.capacity:
            # A slot is free: only batch waits, held back by its share.
            assert capped and all(priority[e] == BATCH for e in queued), queued
            assert running_batch() >= policy.capped_limit
        assert queued.isdisjoint(outcome)  # a decided entry is not still queued

    # Drain: everything still queued starts or times out; nothing is lost.
    now_s += 1.0
    order = policy.queued_in_order(now_s)
    started(policy.set_capacity(max(policy.capacity, 1), now_s), order)
    while running or policy.num_queued:
        now_s += 0.5
        for reject in policy.poll(now_s):
            settle(reject.entry_id, "rejected")
        if running:
            order = policy.queued_in_order(now_s)
            entry_id = sorted(running)[0]
            running.remove(entry_id)
            started(policy.release(entry_id, now_s), order)
    assert policy.num_in_flight == 0 and policy.num_queued == 0
    assert sorted(outcome) == sorted(offered)  # every request got exactly one answer
