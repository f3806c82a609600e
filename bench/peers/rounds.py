"""Rounds: the same sweep again, systems in the other order, and the median of each ratio.

One run of three systems one after the other is one sample: on a shared 2-core host the
ratio at 16 or 64 streams moved by 10-20% between runs minutes apart (docs/benchmarks.md,
"One run is one sample"), and a system that always runs first meets whatever the host did
then. With `--rounds N`, round 1 is the run as before (every scenario) and each later round
starts every system again for a sweep at `LEVELS` only, the order reversed in every other
round. Each round's ratio is taken within that round (systems minutes apart, not an hour);
the figure reported is the median of the rounds' ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

LEVELS = (16, 64)  # the levels the README compares


def order(round_number: int, systems: Sequence[str]) -> list[str]:
    """Round 1 in the given order, round 2 reversed, round 3 as given, and so on."""
    return list(systems) if round_number % 2 else list(reversed(systems))


def throughput(sweep_rows: Sequence[dict[str, Any]] | None, concurrency: int) -> float | None:
    """Output tokens/s at a level, only where every request of that level was served: a refused
    or failed request is not faster work."""
    for row in sweep_rows or ():
        if row["concurrency"] == concurrency:
            if row.get("completed") != row.get("requests"):
                return None
            return row.get("output_throughput")
    return None


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
    return out
