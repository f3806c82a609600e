"""Arrival-rate traces for the autoscaling simulator (bench/autoscaling/simulate.py): one mean rate
a second; a daily cycle compressed in time, a sudden 10x spike, a slow ramp."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Trace:
    name: str
    rate_per_s: np.ndarray  # mean arrivals a second, one value per control period
    description: str
    event_s: float | None = None  # a spike's start, for the time to absorb it
    event_end_s: float | None = None

    @property
    def duration_s(self) -> float:
        return float(len(self.rate_per_s))


def daily_trace(
    duration_s: int = 7200,
    trough_per_s: float = 8.0,
    peak_per_s: float = 64.0,
    shape_power: float = 2.0,
    name: str = "daily",
) -> Trace:
    """A day compressed into `duration_s`, trough at the start and end, peak in the middle.

    rate = trough + (peak - trough) * h(t) ** shape_power, h = (1 - cos(2 pi t / day)) / 2.
    shape_power 1 is a pure sinusoid, whose mean is 56% of its peak at 8x peak/trough; the
    default 2 keeps the night longer and flatter than the afternoon peak, as in real daily
    traffic, with a mean of 45% of the peak.
    """
    t = np.arange(duration_s) / duration_s
    hump = ((1 - np.cos(2 * np.pi * t)) / 2) ** shape_power
    rate = trough_per_s + (peak_per_s - trough_per_s) * hump
    shape = "sinusoid" if shape_power == 1 else f"sinusoid^{shape_power:g}"
    ratio = peak_per_s / trough_per_s
    return Trace(
        name,
        rate,
        f"24 h in {duration_s / 3600:g} h, {trough_per_s:g} -> {peak_per_s:g} "
        f"-> {trough_per_s:g} req/s ({shape}, peak {ratio:g}x trough)",
    )


def spike_trace(
    base_per_s: float = 8.0,
    factor: float = 10.0,
    before_s: int = 600,
    spike_s: int = 900,
    after_s: int = 900,
) -> Trace:
    rate = np.concatenate(
        [
            np.full(before_s, base_per_s),
            np.full(spike_s, base_per_s * factor),
            np.full(after_s, base_per_s),
        ]
    )
    return Trace(
        "spike",
        rate,
        f"{base_per_s:g} req/s, then {factor:g}x at once for {spike_s / 60:g} min, then back",
        event_s=float(before_s),
        event_end_s=float(before_s + spike_s),
    )


def ramp_trace(
    start_per_s: float = 4.0, end_per_s: float = 64.0, ramp_s: int = 3600, hold_s: int = 600
) -> Trace:
    rate = np.concatenate([np.linspace(start_per_s, end_per_s, ramp_s), np.full(hold_s, end_per_s)])
    return Trace(
        "ramp",
        rate,
        f"{start_per_s:g} -> {end_per_s:g} req/s over {ramp_s / 60:g} min, "
        f"then held {hold_s / 60:g} min",
    )


def default_traces() -> list[Trace]:
    return [
        daily_trace(),
        daily_trace(shape_power=1.0, name="daily-sine"),
        spike_trace(),
        ramp_trace(),
    ]
