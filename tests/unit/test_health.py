"""The replica's health verdict (llmserve/policies/health.py): dead, hung or fine, and the
engine's figures less the replica's own probes."""

from __future__ import annotations

import pytest

from llmserve.policies.health import Verdict, client_stats, needs_probe, verdict
from llmserve.protocol.replica_call import EngineStats


def stats(running=0, waiting=0, unfinished=None, kv=0.0, healthy=True) -> EngineStats:
    unfinished = running + waiting if unfinished is None else unfinished
    return EngineStats(running, waiting, unfinished, kv, healthy)


@pytest.mark.parametrize(
    "case, s, stalled_s, expected",
    [
        ("idle and quiet is fine", stats(), 1000.0, Verdict()),
        ("busy and producing is fine", stats(running=3), 2.0, Verdict()),
        ("busy, quiet up to the bound is fine", stats(running=3), 20.0, Verdict()),
        (
            "busy and quiet past the bound hangs",
            stats(running=3),
            20.5,
            Verdict(hung_reason="no engine output for 20 s"),
        ),
        (
            "waiting only, quiet past the bound hangs",
            stats(waiting=1),
            60.0,
            Verdict(hung_reason="no engine output for 60 s"),
        ),
        ("a dead engine is dead, busy or not", stats(healthy=False), 0.0, Verdict(dead=True)),
        ("dead wins over hung", stats(running=2, healthy=False), 99.0, Verdict(dead=True)),
    ],
)
def test_verdict(case, s, stalled_s, expected):
    assert verdict(s, stalled_s, hang_timeout_s=20.0) == expected, case


@pytest.mark.parametrize(
    "case, engine, num_probing, expected",
    [
        ("no probe: the engine's own", stats(2, 1, kv=0.3), 0, stats(2, 1, kv=0.3)),
        ("only the probe: idle, no KV held", stats(1, 0, kv=0.01), 1, stats(0, 0, kv=0.0)),
        ("a probe beside clients", stats(3, 2, kv=0.4), 1, stats(2, 2, unfinished=4, kv=0.4)),
        ("never below zero", stats(0, 0, unfinished=0), 1, stats(0, 0, kv=0.0)),
    ],
)
def test_client_stats_leave_out_the_probes(case, engine, num_probing, expected):
    assert client_stats(engine, num_probing) == expected, case


def test_only_an_idle_engine_is_probed():
    assert needs_probe(stats(), since_output_s=60.0, idle_probe_period_s=60.0)
    assert not needs_probe(stats(running=1), since_output_s=600.0, idle_probe_period_s=60.0)
    # finishing: its output is being watched
    assert not needs_probe(stats(unfinished=1), since_output_s=600.0, idle_probe_period_s=60.0)


def test_an_idle_engine_is_probed_only_when_quiet_for_the_period():
    """Each probe makes vLLM's worker spin for a second: an engine that answered (a request or
    a probe) within the period is not probed again."""
    assert not needs_probe(stats(), since_output_s=59.0, idle_probe_period_s=60.0)
    assert needs_probe(stats(), since_output_s=61.0, idle_probe_period_s=60.0)
    assert needs_probe(stats(), since_output_s=0.0, idle_probe_period_s=0.0)  # every check
