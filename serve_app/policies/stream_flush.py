"""When a replica sends the bytes its engine's server has written so far. Pure.

Each item that crosses a Ray hop costs the sender and the receiver a fixed ~0.1-0.3 ms of CPU,
whatever it holds (bench/relay_cost.py measures it). At GPU rates a stream writes a token every
10-30 ms, so one item per token would make the relay, not the GPU, the limit. A replica therefore
sends at most one item per `interval_s` per stream: whatever was written meanwhile goes together.
The first bytes (the response head and the first token) go at once, and so do bytes written after
a quiet spell longer than the interval: holding back never adds more than `interval_s` to a
token's latency, and adds nothing to a stream slower than one token per interval.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlushPolicy:
    interval_s: float = 0.02

    def hold_s(self, now_s: float, last_flush_s: float | None) -> float:
        """How long to hold bytes that are ready at `now_s` before sending them."""
        if last_flush_s is None or self.interval_s <= 0:
            return 0.0
        return max(0.0, last_flush_s + self.interval_s - now_s)
