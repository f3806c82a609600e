"""bench.first_token's split of a first token by span."""

from __future__ import annotations

from bench.first_token import PHASES, phases, summary

MS = 1_000_000


def _trace(events=({"name": "first_token", "ns": 104 * MS},)):
    return [
        {"name": "POST /v1/completions", "start_ns": 3 * MS, "end_ns": 110 * MS},
        {"name": "authenticate", "start_ns": 3 * MS, "end_ns": 3 * MS},
        {"name": "dispatch", "start_ns": 4 * MS, "end_ns": 105 * MS},
        {"name": "llmserver.generate", "start_ns": 6 * MS, "end_ns": 120 * MS, "events": events},
    ]


def test_a_trace_splits_the_clients_first_token_into_consecutive_phases():
    split = phases(0, 107 * MS, _trace())
    assert split == {
        "to_router": 3.0,
        "router": 1.0,
        "hop": 2.0,
        "engine": 98.0,
        "back": 1.0,
        "to_client": 2.0,
    }
    assert sum(split.values()) == 107.0  # the phases add up to what the client measured


def test_a_trace_without_the_replicas_first_token_or_a_dispatch_is_left_out():
    assert phases(0, 107 * MS, _trace(events=())) is None
    assert phases(0, 107 * MS, [s for s in _trace() if s["name"] != "dispatch"]) is None


def test_summary_gives_each_phase_and_the_total():
    rows = [phases(0, (107 + k) * MS, _trace()) for k in range(10)]
    out = summary(rows)
    assert set(out) == {*PHASES, "total"}
    assert out["engine"]["p50"] == 98.0
    assert out["to_client"]["p10"] == 3.0 and out["to_client"]["p90"] == 11.0
    assert out["total"]["p50"] == 111.5
