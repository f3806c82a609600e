"""Rounds: the same sweep again, systems in the other order, and the median of each ratio.

One run of three systems one after the other is one sample: on a shared 2-core host the
ratio at 16 or 64 streams moved by 10-20% between runs minutes apart (docs/benchmarks.md,
"One run is one sample"), and a system that always runs first meets whatever the host did
then. With `--rounds N`, round 1 is the run as before (every scenario) and each later round
starts every system again for a sweep at one stream and `LEVELS` only, the order reversed in
every other round. Each round's ratio is taken within that round (systems minutes apart, not an
hour); the figure reported is the median of the rounds' ratios. The one stream is there for its
first token: one round's 20 requests gave llmserve x1.13 of bare vLLM's TTFT p50 in one run and
by hand x1.04 hours later (docs/benchmarks.md, "One stream"), so that figure too is the median
of the rounds' ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

LEVELS = (16, 64)  # the levels the README compares for tokens/s
TTFT_LEVEL = 1  # the level the README compares for the first token


def order(round_number: int, systems: Sequence[str]) -> list[str]:
    """Round 1 in the given order, round 2 reversed, round 3 as given, and so on."""
    return list(systems) if round_number % 2 else list(reversed(systems))


def served(
    sweep_rows: Sequence[dict[str, Any]] | None, concurrency: int, metric: str
) -> float | None:
    """A level's figure, only where every request of that level was served: a refused or failed
    request is not faster work."""
    for row in sweep_rows or ():
        if row["concurrency"] == concurrency:
            return row.get(metric) if row.get("completed") == row.get("requests") else None
    return None


def throughput(sweep_rows: Sequence[dict[str, Any]] | None, concurrency: int) -> float | None:
    return served(sweep_rows, concurrency, "output_throughput")


def ttft(sweep_rows: Sequence[dict[str, Any]] | None, concurrency: int) -> float | None:
    return served(sweep_rows, concurrency, "ttft_p50_ms")


def summarize(
    rounds: Sequence[dict[str, Sequence[dict[str, Any]] | None]],
    baseline: str,
    levels: Sequence[int] = LEVELS,
) -> dict[str, Any]:
    """`rounds`: per round, each system's sweep rows. Per level and system: output tokens/s of
    each round, their median, each round's ratio to the baseline of the same round and the
    median of those ratios (rounds where either side is missing are left out of the ratio)."""
    out: dict[str, Any] = {"rounds": len(rounds), "baseline": baseline, "levels": {}}
    names = sorted({n for r in rounds for n in r})
    for c in levels:
        level: dict[str, Any] = {}
        bases = [throughput(r.get(baseline), c) for r in rounds]
        for name in names:
            tps = [throughput(r.get(name), c) for r in rounds]
            pairs = zip(tps, bases) if name != baseline else ()
            ratios = [round(tp / base, 3) for tp, base in pairs if tp is not None and base]
            served = [t for t in tps if t is not None]
            level[name] = {
                "output_throughput": tps,
                "median_output_throughput": round(statistics.median(served), 1) if served else None,
                "ratios": ratios,
                "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
            }
        out["levels"][str(c)] = level
    out["ttft"] = _ttft(rounds, baseline, names)
    return out


def _ttft(
    rounds: Sequence[dict[str, Sequence[dict[str, Any]] | None]], baseline: str, names: list[str]
) -> dict[str, Any]:
    """TTFT p50 at one stream by round, each round's ratio to the baseline's and its difference
    in ms, and their medians. Empty where no round swept one stream."""
    bases = [ttft(r.get(baseline), TTFT_LEVEL) for r in rounds]
    if not any(bases):
        return {}
    out: dict[str, Any] = {"concurrency": TTFT_LEVEL}
    for name in names:
        ms = [ttft(r.get(name), TTFT_LEVEL) for r in rounds]
        pairs = [(t, b) for t, b in zip(ms, bases) if t is not None and b]
        pairs = pairs if name != baseline else []
        ratios = [round(t / b, 3) for t, b in pairs]
        diffs = [round(t - b, 1) for t, b in pairs]
        out[name] = {
            "ttft_p50_ms": ms,
            "ratios": ratios,
            "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
            "diffs_ms": diffs,
            "median_diff_ms": round(statistics.median(diffs), 1) if diffs else None,
        }
    return out
