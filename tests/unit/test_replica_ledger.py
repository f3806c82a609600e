"""The request router's bookkeeping (llmserve/policies/replica_ledger.py), as tables."""

from __future__ import annotations

import pytest

from llmserve.policies.replica_ledger import InFlight, Sessions


@pytest.mark.parametrize(
    "events, counts, tracked",
    [
        ([], {"a": 0}, 0),
        ([("routed", "a", "1"), ("routed", "a", "2"), ("routed", "b", "3")], {"a": 2, "b": 1}, 3),
        ([("routed", "a", "1"), ("completed", "a", "1")], {"a": 0}, 0),
        # A completion Ray reports for a request the replica rejected: never counted, so it
        # takes nothing off the requests that are in flight.
        ([("routed", "a", "1"), ("completed", "a", "9")], {"a": 1}, 1),
        ([("completed", "a", "1")], {"a": 0}, 0),
        # The same request completed twice (retries inside Ray): once off, never negative.
        ([("routed", "a", "1"), ("completed", "a", "1"), ("completed", "a", "1")], {"a": 0}, 0),
        # A replica that died forgets its requests; the others keep theirs.
        ([("routed", "a", "1"), ("routed", "b", "2"), ("forget", "a", "")], {"a": 0, "b": 1}, 1),
        ([("routed", "a", "1"), ("forget", "a", ""), ("completed", "a", "1")], {"a": 0}, 0),
        # A quick call that completed before Ray reported it routed: never in flight, so its
        # replica's count does not grow with every such call.
        ([("completed", "a", "1"), ("routed", "a", "1")], {"a": 0}, 0),
        (
            [("completed", "a", "1"), ("routed", "a", "1"), ("routed", "a", "2")],
            {"a": 1},
            1,
        ),
        # Only the same request on the same replica: a completion elsewhere takes nothing off.
        ([("completed", "b", "1"), ("routed", "a", "1")], {"a": 1}, 1),
        # At most max_early (here 2) such completions are remembered, the oldest go first.
        (
            [("completed", "a", "1"), ("completed", "a", "2"), ("completed", "a", "3")]
            + [("routed", "a", "1"), ("routed", "a", "2"), ("routed", "a", "3")],
            {"a": 1},
            1,
        ),
        # A replica that died forgets those too.
        ([("completed", "a", "1"), ("forget", "a", ""), ("routed", "a", "1")], {"a": 1}, 1),
    ],
)
def test_in_flight(events, counts, tracked):
    ledger = InFlight(max_early_completions=2)
    for kind, replica, request in events:
        if kind == "forget":
            ledger.forget(replica)
        else:
            getattr(ledger, kind)(replica, request)
    assert {r: ledger[r] for r in counts} == counts
    assert len(ledger) == tracked


@pytest.mark.parametrize(
    "visits, max_sessions, expected",
    [
        ([("s1", "a")], 3, {"s1": "a"}),
        ([("s1", "a"), ("s1", "b")], 3, {"s1": "b"}),  # the last replica it went to
        ([("", "a"), (None, "b")], 3, {}),  # no session: nothing remembered
        # Beyond the bound the least recently used goes first: s1 was used again, so s2 goes.
        (
            [("s1", "a"), ("s2", "a"), ("s3", "b"), ("s1", "b"), ("s4", "a")],
            3,
            {"s3": "b", "s1": "b", "s4": "a"},
        ),
    ],
)
def test_sessions(visits, max_sessions, expected):
    sessions = Sessions(max_sessions)
    for session, replica in visits:
        sessions.went_to(session, replica)
    assert {s: sessions.get(s) for s in sessions} == expected
    assert list(sessions) == list(expected)  # least recently used first
    assert sessions.get("unknown") is None and sessions.get(None) is None
