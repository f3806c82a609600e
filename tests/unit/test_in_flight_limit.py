"""The adaptive in-flight limit (llmserve/policies/in_flight_limit.py): promises missed cut it,
promises kept with room while it binds grow it, once per round, within its bounds."""

from __future__ import annotations

import pytest

from llmserve.policies.in_flight_limit import InFlightLimit

OBJECTIVE_S = 2.0


def limit(max_limit: int = 40, min_limit: int = 4) -> InFlightLimit:
    return InFlightLimit(min_limit=min_limit, max_limit=max_limit)


def in_line(lim: InFlightLimit, entry_id: str, arrival_s: float, now_s: float) -> None:
    """Starts `entry_id` behind another request still waiting for its first token."""
    lim.started(f"{entry_id}-ahead", 1, arrival_s, OBJECTIVE_S, now_s)
    lim.started(entry_id, 1, arrival_s, OBJECTIVE_S, now_s)


def test_a_request_that_waited_behind_no_one_is_late_on_its_own_and_cuts_nothing():
    # A long prompt alone misses its promise by its own prefill, not by the load: cutting the
    # limit for it would starve everyone else (a tenant's runaway prompts).
    lim = limit()
    lim.started("long", 1, 0.0, OBJECTIVE_S, 0.0)
    assert not lim.overdue(2.5)
    assert not lim.first_token("long", 4.0)
    assert lim.limit == 40


def test_starts_at_the_cap_and_a_kept_promise_without_load_leaves_it():
    lim = limit()
    assert lim.limit == 40
    lim.started("a", 1, 0.0, OBJECTIVE_S, 0.0)
    assert not lim.first_token("a", 0.3)
    assert lim.limit == 40


def test_a_late_first_token_cuts_the_limit_by_a_fifth():
    lim = limit()
    in_line(lim, "a", 0.0, 0.1)
    assert lim.first_token("a", 2.5)
    assert lim.limit == 32


def test_the_due_time_counts_from_arrival_so_a_queue_wait_makes_it_late():
    lim = limit()
    in_line(lim, "a", 0.0, 1.5)  # waited 1.5 s in the queue, then 0.6 s to its token
    assert lim.first_token("a", 2.1)
    assert lim.limit == 32


def test_one_cut_per_round_the_requests_admitted_before_it_do_not_cut_again():
    lim = limit()
    for i in range(10):
        in_line(lim, f"r{i}", 0.0, 0.0)
    assert lim.first_token("r0", 3.0)
    for i in range(1, 10):
        assert not lim.first_token(f"r{i}", 3.0 + i)
    assert (lim.limit, lim.num_decreases) == (32, 1)
    in_line(lim, "after", 3.5, 3.5)  # admitted under the new limit, and late too
    assert lim.first_token("after", 6.0)
    assert lim.limit == 25


def test_a_request_past_due_without_its_token_cuts_before_the_token_comes():
    lim = limit()
    in_line(lim, "stalled", 0.0, 0.0)
    assert not lim.overdue(1.9)
    assert lim.overdue(2.1)
    assert lim.limit == 32
    assert not lim.overdue(5.0)  # the same round
    assert not lim.first_token("stalled", 9.0)  # counted once
    assert lim.limit == 32


@pytest.mark.parametrize(
    ("took_s", "in_flight", "started_s", "grows"),
    [
        (0.5, 20, 10.0, True),  # within half its objective, started with the limit full
        (1.0, 20, 10.0, True),  # exactly half
        (1.5, 20, 10.0, False),  # kept, but without room: hold
        (0.5, 19, 10.0, False),  # it started below the limit: nothing learned about more
        (0.5, 20, 9.0, False),  # it started before the last cut: admitted under the old limit
    ],
)
def test_growth_needs_room_a_full_limit_and_a_new_round(took_s, in_flight, started_s, grows):
    lim = limit()
    in_line(lim, "late", 0.0, 0.0)
    lim.first_token("late", 3.0)  # 40 -> 32
    in_line(lim, "late2", 3.5, 3.5)
    lim.first_token("late2", 6.0)  # 32 -> 25
    in_line(lim, "b", 7.0, 7.0)
    lim.first_token("b", 9.5)  # 25 -> 20
    assert lim.limit == 20
    lim.started("ok", 1, started_s, OBJECTIVE_S, started_s, num_in_flight=in_flight)
    assert lim.first_token("ok", started_s + took_s) is grows
    assert lim.limit == (21 if grows else 20)


def test_bounds_the_floor_and_the_cap():
    lim = limit(max_limit=6, min_limit=4)
    in_line(lim, "a", 0.0, 0.0)
    lim.first_token("a", 3.0)
    assert lim.limit == 4
    in_line(lim, "b", 4.0, 4.0)
    assert not lim.first_token("b", 9.0)  # at the floor: stays
    for i in range(5):
        lim.started(f"g{i}", 1, 10.0 + i, OBJECTIVE_S, 10.0 + i, num_in_flight=lim.limit)
        lim.first_token(f"g{i}", 10.2 + i)
    assert lim.limit == 6  # grew back to the cap, not past it


def test_the_limit_keeps_its_share_of_the_cap_as_replicas_come_and_go():
    lim = limit(max_limit=48)
    lim.set_max(24)  # a replica left
    assert lim.limit == 24
    lim.set_max(72)  # two more came
    assert lim.limit == 72
    in_line(lim, "a", 0.0, 0.0)
    assert lim.first_token("a", 3.0)
    assert lim.limit == 57  # 0.8 of the cap
    lim.set_max(24)
    assert lim.limit == 19
    lim.set_max(0)  # scaled to zero (or not started yet): the floor
    assert lim.limit == 4
    lim.set_max(48)  # back: the share it had, not the whole cap
    assert lim.limit == 38


def test_a_start_below_the_cap_survives_the_replicas_first_count():
    # The Router counts the model's live replicas once they are up: none at first.
    lim = InFlightLimit(min_limit=4, max_limit=48, start_limit=32)
    lim.set_max(0)
    lim.set_max(48)
    assert lim.limit == 32


def test_ended_requests_are_forgotten():
    lim = limit()
    lim.started("a", 1, 0.0, OBJECTIVE_S, 0.0)
    lim.forget("a")
    assert not lim.overdue(10.0)
    assert lim.limit == 40


@pytest.mark.parametrize(
    "kwargs",
    [{"min_limit": 0}, {"decrease": 1.0}, {"decrease": 0.0}, {"headroom": 0.0}],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        InFlightLimit(**{"min_limit": 1, "max_limit": 8, **kwargs})


def test_the_line_to_a_first_token_is_measured_in_gaps_while_a_line_waited():
    lim = limit()
    assert lim.expected_first_s(1) is None  # nothing seen yet
    for i in range(6):
        lim.started(f"r{i}", 1, 0.0, OBJECTIVE_S, 0.0)
    assert lim.expected_first_s(1) is None  # a line, but no gap measured yet
    lim.first_token("r0", 0.5)  # the first: a latency, not a gap
    assert lim.gap_s is None
    lim.first_token("r1", 0.8)  # 0.3 s after r0, with r1..r5 waiting
    assert lim.gap_s is None  # one gap is no rate yet
    lim.first_token("r2", 1.1)
    lim.first_token("r3", 1.4)
    assert lim.gap_s == pytest.approx(0.3)  # three, each 0.3 s
    # Two still wait: a newcomer of their class is third in line; fifth behind two queued.
    assert lim.expected_first_s(1) == pytest.approx(0.9)
    assert lim.expected_first_s(1, {0: 1, 1: 1, 2: 5}) == pytest.approx(1.5)  # 2 of 7 ahead
    # A more urgent newcomer goes before them (the engine's priority), a less urgent after.
    assert lim.expected_first_s(0) is None
    lim.started("i", 0, 1.5, 1.0, 1.5)
    assert lim.expected_first_s(0) == pytest.approx(0.6)
    assert lim.expected_first_s(2) == pytest.approx(1.2)


def test_one_slow_prefill_in_a_line_of_two_refuses_nothing():
    """A light load: a long prompt and a short one start together on a cold engine and get
    their first tokens together after 3 s. Two gaps (2.9 s and none) are no rate: a short
    request arriving next, with one request ahead, has no line estimate to be refused by."""
    lim = limit()
    for name in ("short", "long", "other"):
        lim.started(name, 1, 0.0, OBJECTIVE_S, 0.0)
    lim.first_token("short", 0.2)
    lim.first_token("long", 3.1)
    lim.first_token("other", 3.1)
    lim.started("next-long", 1, 3.6, OBJECTIVE_S, 3.6)
    assert lim.expected_first_s(1) is None


def test_a_request_that_found_no_line_measures_no_gap():
    lim = limit()
    lim.started("a", 1, 0.0, OBJECTIVE_S, 0.0)
    lim.first_token("a", 0.4)
    lim.started("b", 1, 5.0, OBJECTIVE_S, 5.0)  # long after: the idle time is no gap
    lim.first_token("b", 5.4)
    assert lim.gap_s is None


def test_the_gap_is_a_rate_over_seconds_so_a_step_s_burst_of_first_tokens_does_not_hide_it():
    lim = limit()
    for i in range(12):
        lim.started(f"r{i}", 1, 0.0, OBJECTIVE_S, 0.0)
    lim.first_token("r0", 1.0)
    # One prefill step 1.2 s later gives ten first tokens at once: 1.2 s for ten, not ~0.
    for i in range(1, 11):
        lim.first_token(f"r{i}", 2.2)
    assert lim.gap_s == pytest.approx(0.12)
    # A second later the old step weighs less than the new wait: (1.2 k + 1) / (10 k + 1) with
    # k = exp(-1 / 5), not the undecayed 2.2 / 11 = 0.2.
    lim.first_token("r11", 3.2)
    assert lim.gap_s == pytest.approx(0.2158, abs=0.001)


@pytest.mark.parametrize(("start", "limit_at"), [(32, 32), (60, 40), (1, 4), (None, 40)])
def test_it_starts_at_the_engine_slots_within_its_bounds(start, limit_at):
    assert InFlightLimit(min_limit=4, max_limit=40, start_limit=start).limit == limit_at


def test_a_stream_without_a_promise_only_grows_the_limit_and_is_no_line():
    lim = InFlightLimit(min_limit=4, max_limit=40, start_limit=8)
    for i in range(8):
        lim.started(f"b{i}", 2, 0.0, OBJECTIVE_S, 0.0, promised=False)
    # Late: it was promised nothing, so nothing is cut, on the tick or at its token.
    assert not lim.overdue(30.0)
    assert not lim.first_token("b0", 30.0)
    assert lim.limit == 8
    # Fast against the tightest promise while the limit binds: the engine has room.
    lim.started("b8", 2, 30.0, OBJECTIVE_S, 30.0, num_in_flight=8, promised=False)
    assert lim.first_token("b8", 30.3)
    assert lim.limit == 9
    # Seven batch streams still wait for a first token: no line for a promised class, no gap,
    # and a promised request started now waited behind no one.
    assert lim.expected_first_s(1) is None and lim.gap_s is None
    lim.started("s", 1, 31.0, OBJECTIVE_S, 31.0)
    assert not lim.first_token("s", 34.0)  # late, but on its own
    assert lim.limit == 9 and lim.engine_s == pytest.approx(3.0)


def test_a_line_that_left_without_its_first_tokens_leaves_no_gap_behind():
    lim = limit()
    for i in range(3):
        lim.started(f"r{i}", 1, 0.0, OBJECTIVE_S, 0.0)
    lim.first_token("r0", 0.5)
    lim.forget("r1")  # their clients left
    lim.forget("r2")
    lim.started("a", 1, 60.0, OBJECTIVE_S, 60.0)
    lim.started("b", 1, 60.0, OBJECTIVE_S, 60.0)
    lim.first_token("a", 60.4)
    assert lim.gap_s is None  # the idle minute was not a gap between first tokens
