"""The admission queue's wait arithmetic (llmserve/policies/wait_estimate.py), as tables."""

from __future__ import annotations

import pytest

from llmserve.policies.wait_estimate import (
    engine_wait_s,
    mean_service_s,
    queue_wait_s,
    retry_after_s,
)


def test_mean_service_time_starts_at_the_first_and_moves_a_tenth_of_the_way():
    assert mean_service_s(None, 2.0) == 2.0
    assert mean_service_s(2.0, 12.0) == pytest.approx(3.0)
    assert mean_service_s(2.0, 1000.0) < 102  # one runaway request barely moves it


@pytest.mark.parametrize(
    ("ahead", "mean_s", "slots", "expected"),
    [(0, 2.0, 4, 0.5), (3, 2.0, 4, 2.0), (0, None, 4, None), (5, 2.0, 0, None)],
)
def test_queue_wait(ahead, mean_s, slots, expected):
    assert queue_wait_s(ahead, mean_s, slots) == expected


@pytest.mark.parametrize(
    ("ahead", "in_flight", "slots", "expected"),
    [
        (0, 3, 4, 0.0),  # a slot is free
        (0, 4, 4, 0.5),  # all busy: the next one to free
        (0, 6, 4, 1.5),  # two admitted still in the engines' line go first
        (2, 6, 4, 2.5),  # and two queued ahead
    ],
)
def test_engine_wait(ahead, in_flight, slots, expected):
    assert engine_wait_s(ahead, in_flight, slots, 2.0) == expected
    assert engine_wait_s(ahead, in_flight, slots, None) is None


@pytest.mark.parametrize(
    ("queued", "mean_s", "capacity", "expected"),
    [
        (8, 2.0, 4, 4.0),  # the queue worked off at the observed rate
        (100, 2.0, 4, 30.0),  # at most the class's wait bound
        (1, 0.1, 4, 1.0),  # at least the floor
        (8, None, 4, 1.0),  # nothing seen yet: the floor
        (8, 2.0, 0, 30.0),  # no replica up: the bound
    ],
)
def test_retry_after(queued, mean_s, capacity, expected):
    assert retry_after_s(queued, mean_s, capacity, min_s=1.0, max_wait_s=30.0) == expected
