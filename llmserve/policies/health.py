"""A replica's health verdict from its engine's figures: pure, the clock passed in.

The LLMServer replica gathers the figures (its engine's stats, the health probes it has in the
engine, when the engine last produced output) and acts on the verdict: a dead engine makes the
replica exit at once, a hung one fails the next health check, so Serve replaces it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmserve.protocol.replica_call import EngineStats


@dataclass(frozen=True)
class Verdict:
    dead: bool = False
    hung_reason: str | None = None  # set when the engine holds requests but produces nothing


def client_stats(stats: EngineStats, num_probing: int) -> EngineStats:
    """The engine's figures less the replica's own health probes: a probe is neither load for
    routing and autoscaling nor a stalled client request."""
    if not num_probing:
        return stats
    unfinished = max(0, stats.num_unfinished - num_probing)
    return dataclasses.replace(
        stats,
        num_running=max(0, stats.num_running - num_probing),
        num_unfinished=unfinished,
        # With only the probe in the engine, no client request holds a KV block.
        kv_cache_usage=stats.kv_cache_usage if unfinished else 0.0,
    )


def verdict(stats: EngineStats, stalled_s: float, hang_timeout_s: float) -> Verdict:
    """`stats` are client stats; `stalled_s` is the time since the engine's last output."""
    if not stats.healthy:
        return Verdict(dead=True)
    if stats.num_unfinished and stalled_s > hang_timeout_s:
        return Verdict(hung_reason=f"no engine output for {stalled_s:.0f} s")
    return Verdict()


def needs_probe(stats: EngineStats, since_output_s: float, idle_probe_period_s: float) -> bool:
    """An idle engine must still answer a one-token probe; a busy one shows it is alive by its
    output, which the hang check watches. `since_output_s`: since the engine last produced
    output (a request's or a probe's) or took a request. Not at every health check: each probe
    makes vLLM's worker spin for a second after it."""
    return stats.num_unfinished == 0 and since_output_s >= idle_probe_period_s
