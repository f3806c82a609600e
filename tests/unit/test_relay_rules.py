"""The Router's relay rules (llmserve/policies/relay.py), as tables."""

from __future__ import annotations

import pytest

from llmserve.policies.relay import (
    AfterAttempt,
    Attempt,
    Deadline,
    Next,
    after_attempt,
    deadline_action,
    head_wait_s,
    past_deadline,
    tokens_charged,
)


@pytest.mark.parametrize(
    "attempt, outcome, replica, expected",
    [
        (1, Attempt.HEAD, "r1", AfterAttempt(Next.RELAY)),
        (2, Attempt.HEAD, "r2", AfterAttempt(Next.RELAY)),
        # A refusing replica is skipped on the retry; a failed call skips none.
        (1, Attempt.UNHEALTHY, "r1", AfterAttempt(Next.RETRY, avoid_replica="r1")),
        (1, Attempt.UNHEALTHY, "", AfterAttempt(Next.RETRY)),
        (1, Attempt.FAILED, "r1", AfterAttempt(Next.RETRY)),
        # One retry only; the 503 says why.
        (2, Attempt.UNHEALTHY, "r2", AfterAttempt(Next.GIVE_UP, code="replica_unhealthy")),
        (2, Attempt.FAILED, "", AfterAttempt(Next.GIVE_UP)),
    ],
)
def test_after_attempt(attempt, outcome, replica, expected):
    assert after_attempt(attempt, outcome, replica) == expected


@pytest.mark.parametrize(
    "now, deadline, finished, expired, expected",
    [
        (5.0, 10.0, False, False, Deadline.KEEP),
        (5.0, 10.0, True, False, Deadline.FORGET),
        (20.0, 10.0, True, True, Deadline.FORGET),  # finished wins, however late
        (10.5, 10.0, False, False, Deadline.EXPIRE),
        (10.0, 10.0, False, False, Deadline.KEEP),  # at the deadline, not past it
        (12.0, 10.0, False, True, Deadline.KEEP),  # cancelled, its reader still cleaning up
        (15.5, 10.0, False, True, Deadline.RECLAIM),  # past the 5 s grace: nobody reads it
        (15.5, 10.0, False, False, Deadline.EXPIRE),  # never expired yet: expire first
    ],
)
def test_deadline_action(now, deadline, finished, expired, expected):
    assert deadline_action(now, deadline, finished, expired) == expected


def test_the_reclaim_grace_is_a_parameter():
    assert deadline_action(11.5, 10.0, False, True, grace_s=1.0) is Deadline.RECLAIM
    assert deadline_action(11.5, 10.0, False, True, grace_s=2.0) is Deadline.KEEP


@pytest.mark.parametrize(
    "now, deadline, expired, expected",
    [
        (9.9, 10.0, False, False),  # in time
        (10.0, 10.0, False, False),  # at the deadline itself: still in time, as on the tick
        (10.1, 10.0, False, True),  # passed before the tick came round
        (9.9, 10.0, True, True),  # the tick expired it: up, whatever this clock says
    ],
)
def test_past_deadline(now, deadline, expired, expected):
    assert past_deadline(now, deadline, expired) is expected


@pytest.mark.parametrize(
    "now, deadline, expected",
    [
        (100.0, 110.0, 12.0),  # its time left, then the grace
        (100.0, 100.0, 2.0),
        (100.0, 90.0, 2.0),  # already past: the grace alone, never a negative wait
    ],
)
def test_head_wait_is_the_time_left_then_the_grace(now, deadline, expected):
    assert head_wait_s(now, deadline) == expected


@pytest.mark.parametrize(
    "used, reserved, replica_failed, charged",
    [
        (120, 600, False, 120),  # the usage the replica counted, whatever was reserved
        (120, 600, True, 120),  # an engine failure after the end was counted: still the usage
        (None, 600, False, 600),  # cut short by the client or the deadline: the reservation
        (None, 600, True, 0),  # cut short by the replica's failure: nothing
        (0, 600, False, 0),
    ],
)
def test_tokens_charged(used, reserved, replica_failed, charged):
    assert tokens_charged(used, reserved, replica_failed) == charged
