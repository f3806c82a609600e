"""Batch prefills held to a few at a time (llmserve/policies/prefill_window.py, used by
llmserve/policies/admission.py): an engine runs the prefills it admitted before any request
waiting, so a wave of batch starts would hold back every interactive first token behind it."""

from __future__ import annotations

import pytest

from llmserve.policies.admission import Admit, Queue
from llmserve.policies.prefill_window import PrefillWindow
from tests.unit.test_admission import BATCH, INTERACTIVE, make


def policy(share: float = 0.25, capacity: int = 12, engine_slots: int = 8):
    return make(
        capacity=capacity,
        capped_priority=BATCH,
        batch_max_share=0.75,
        batch_prefill_share=share,
        engine_slots=engine_slots,
    )


def test_a_wave_of_batch_starts_is_held_to_its_prefills_and_interactive_passes():
    p = policy()  # 8 engine slots: batch may hold 6, two of them in prefill
    decisions = [p.offer(f"b{i}", BATCH, 0.0) for i in range(6)]
    assert [type(d) for d in decisions] == [Admit, Admit, Queue, Queue, Queue, Queue]
    assert p.offer("i0", INTERACTIVE, 0.1) == Admit("i0")  # its prefill is not held back
    p.prefills.first_token("b0", 0.3)
    assert p.start_due(0.3) == ["b2"]  # one prefill over: the next batch request starts
    p.prefills.first_token("b1", 0.35)
    p.prefills.first_token("b2", 0.4)
    assert p.start_due(0.4) == ["b3", "b4"]
    p.prefills.first_token("b3", 0.5)
    assert p.start_due(0.5) == ["b5"]
    assert p.num_in_flight == 7 and p.num_queued == 0


def test_a_batch_request_that_ends_or_is_preempted_leaves_its_prefill():
    p = make(
        capacity=8,
        capped_priority=BATCH,
        batch_prefill_share=0.25,
        engine_slots=8,
        ttft_objective_s_by_level={INTERACTIVE: 1.0},
    )
    for i in range(3):
        p.offer(f"b{i}", BATCH, 0.0)
    assert p.release("b0", 1.0) == ["b2"]  # ended without a first token (an error, a cancel)
    p.mark_preemptible("b1", BATCH)
    assert isinstance(p.offer("b3", BATCH, 1.1), Queue)
    decisions = [p.offer(f"i{i}", INTERACTIVE, 1.2) for i in range(7)]
    assert decisions[-1] == Admit("i6", preempted="b1")  # the slots full: b1 gives its own
    assert p.is_queued("b1") and len(p.prefills) == 1  # b2 alone is in its prefill


def test_unseen_first_tokens_count_for_the_mean_prefill_measured_on_streams():
    w = PrefillWindow(0.25)
    w.started("plain", 0.0)
    w.unseen_first_token("plain", 0.0)  # nothing measured yet: not held
    assert len(w) == 0
    w.started("stream", 0.0)
    w.first_token("stream", 0.8)  # a prefill takes 0.8 s
    w.started("plain", 1.0)
    w.unseen_first_token("plain", 1.0)
    assert w.is_full(4, 1.7) and not w.is_full(4, 1.8)  # the limit of 4 slots is 1


def test_a_queued_batch_request_starts_when_a_counted_prefill_is_over():
    p = policy(engine_slots=4)  # one batch prefill at a time
    p.offer("m", BATCH, 0.0)
    p.prefills.first_token("m", 0.5)  # measured: half a second
    p.offer("b0", BATCH, 1.0)
    p.prefills.unseen_first_token("b0", 1.0)  # non-streamed: until 1.5
    assert isinstance(p.offer("b1", BATCH, 1.2), Queue)
    assert p.start_due(1.4) == [] and p.start_due(1.5) == ["b1"]


def test_share_one_holds_nothing_and_bad_shares_are_refused():
    p = policy(share=1.0)
    assert all(isinstance(p.offer(f"b{i}", BATCH, 0.0), Admit) for i in range(6))
    for share in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="batch_prefill_share"):
            policy(share=share)


def waiting_policy(wait: bool = True):
    return make(
        capacity=12,
        capped_priority=BATCH,
        batch_max_share=0.75,
        batch_waits_for_first_tokens=wait,
        engine_slots=8,
        ttft_objective_s_by_level={INTERACTIVE: 1.0},
    )


def test_batch_waits_while_a_promised_request_is_in_its_prefill():
    p = waiting_policy()
    assert p.offer("b0", BATCH, 0.0) == Admit("b0")
    assert p.offer("i0", INTERACTIVE, 0.1) == Admit("i0")
    assert isinstance(p.offer("b1", BATCH, 0.2), Queue)  # it would share i0's prefill steps
    assert p.start_due(0.3) == []
    p.prefills.first_token("i0", 0.35)
    assert p.start_due(0.35) == ["b1"]


def test_a_promised_prefill_holds_batch_its_objective_at_most_or_until_it_ends():
    p = waiting_policy()
    p.offer("i0", INTERACTIVE, 0.0)
    assert isinstance(p.offer("b0", BATCH, 0.1), Queue)
    assert p.start_due(0.99) == [] and p.start_due(1.0) == ["b0"]  # its objective of 1 s
    p.offer("i1", INTERACTIVE, 2.0)
    assert isinstance(p.offer("b1", BATCH, 2.1), Queue)
    assert p.release("i1", 2.2) == ["b1"]  # it ended without a first token (an error)


def test_a_non_streamed_promised_request_holds_batch_for_a_mean_prefill():
    p = waiting_policy()
    p.offer("m", BATCH, 0.0)
    p.prefills.first_token("m", 0.4)  # a prefill takes 0.4 s
    p.offer("i0", INTERACTIVE, 1.0)
    p.prefills.unseen_first_token("i0", 1.0)
    assert isinstance(p.offer("b0", BATCH, 1.1), Queue)
    assert p.start_due(1.39) == [] and p.start_due(1.4) == ["b0"]
    w = PrefillWindow(1.0, yield_to_promised=True)  # before any prefill was measured
    w.promised_started("plain", 0.0, 1.0)
    w.unseen_first_token("plain", 0.0)
    assert not w.is_full(8, 0.0)


def test_without_the_setting_batch_starts_beside_a_promised_prefill():
    p = waiting_policy(wait=False)
    p.offer("i0", INTERACTIVE, 0.0)
    assert p.offer("b0", BATCH, 0.1) == Admit("b0")
