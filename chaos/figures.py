"""What a load's results say: failures by kind, success rate in a window, the summary every
scenario reports."""

from __future__ import annotations

from dataclasses import asdict

from chaos.load import Result


def failures(results: list[Result]) -> list[Result]:
    return [r for r in results if not r.ok]


def outcome_counts(results: list[Result]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in failures(results):
        key = r.outcome if r.status in (None, 200) else f"{r.outcome}_{r.status}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def ok_rate(results: list[Result], t_from: float, t_to: float) -> float:
    """Successful requests finished per second in [t_from, t_to)."""
    if t_to <= t_from:
        return 0.0
    return sum(1 for r in results if r.ok and t_from <= r.end_s < t_to) / (t_to - t_from)


def differing_answers(results: list[Result]) -> int:
    """Answers that differ from the most common one to the same prompt (greedy: none should)."""
    by_prompt: dict[int, dict[str, int]] = {}
    for r in results:
        if r.ok and r.answer:
            counts = by_prompt.setdefault(r.prompt, {})
            counts[r.answer] = counts.get(r.answer, 0) + 1
    return sum(sum(c.values()) - max(c.values()) for c in by_prompt.values())


def summary(results: list[Result], t0: float) -> dict:
    """The figures every scenario reports about its load."""
    bad = failures(results)
    return {
        "sent": len(results),
        "ok": len(results) - len(bad),
        "failed": len(bad),
        "failed_by_outcome": outcome_counts(results),
        "unclean_failures": sum(1 for r in bad if not r.clean),
        "hangs": sum(1 for r in bad if r.outcome == "hang"),
        "resumed": sum(r.resumes for r in results),
        "resumed_ok": sum(1 for r in results if r.resumes and r.ok),
        "differing_answers": differing_answers(results),
        "max_latency_s": round(max((r.end_s - r.start_s for r in results), default=0.0), 2),
        "failures": [
            dict(asdict(r), start_s=round(r.start_s - t0, 2), end_s=round(r.end_s - t0, 2))
            for r in bad[:20]
        ],
    }
