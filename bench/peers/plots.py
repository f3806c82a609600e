"""The run's two plots: throughput and TTFT against concurrency, TTFT p99 and goodput against
offered load (bench/peers/report.py writes them beside the markdown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.peers import spec

LABELS = {**spec.LABELS, "llmserve": "llmserve (this)"}
ORDER = list(spec.LABELS)


def systems(results: dict[str, Any]) -> list[str]:
    present = results["systems"]
    return [s for s in ORDER if s in present] + [s for s in present if s not in ORDER]


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def throughput(results: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for s in systems(results):
        rows = results["systems"][s].get("sweep") or []
        c = [row["concurrency"] for row in rows]
        ax1.plot(c, [row["output_throughput"] for row in rows], marker="o", label=LABELS.get(s, s))
        ax2.plot(c, [row["ttft_p50_ms"] for row in rows], marker="o", label=LABELS.get(s, s))
    for ax, title, ylabel in (
        (ax1, "Throughput vs concurrency", "output tokens/s"),
        (ax2, "TTFT p50 vs concurrency", "ms"),
    ):
        _style(ax, title, "concurrent requests (closed loop)", ylabel)
        _log2_ticks(ax, results["workload"]["concurrencies"], "{:g}")
    if any(len(line.get_xdata()) for line in ax2.get_lines()):  # a run without the sweep: none
        ax2.set_yscale("log")
    _save(plt, fig, results, path)


def latency(results: dict[str, Any], path: Path) -> None:
    plt = _plt()
    w = results["workload"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for s in systems(results):
        rows = results["systems"][s].get("open_loop") or []
        x = [row["load_x_capacity"] for row in rows]
        ax1.plot(x, [row["ttft_p99_ms"] for row in rows], marker="o", label=LABELS.get(s, s))
        ax2.plot(x, [row["goodput_rps"] for row in rows], marker="o", label=LABELS.get(s, s))
    ax1.axhline(w["ttft_slo_ms"], color="grey", linestyle="--", linewidth=1, label="TTFT target")
    for ax, title, ylabel in (
        (ax1, "TTFT p99 of completed requests vs load", "ms"),
        (ax2, "Goodput vs load", "requests/s within targets"),
    ):
        _style(ax, title, "offered load (x capacity, Poisson)", ylabel)
        _log2_ticks(ax, w["loads_x_capacity"], "{:g}x")
    ax1.set_yscale("log")
    _save(plt, fig, results, path)


def _style(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize="small")  # a fixed place: "best" is slow to find


def _log2_ticks(ax, values: list[float], fmt: str) -> None:
    """Levels double, so a log2 axis spaces them evenly; ticks at the levels, labelled plainly."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [fmt.format(v) for v in values])
    ax.minorticks_off()


def _save(plt, fig, results: dict[str, Any], path: Path) -> None:
    m, w = results["machine"], results["workload"]
    fig.suptitle(
        f"{results['model']['name']}, {w['input_len']} in / {w['output_len']} out; "
        f"{m['cpu_model']}, {m['physical_cores']} cores; {results['date']} "
        f"({results['mode']})",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
