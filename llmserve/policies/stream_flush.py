"""When a replica sends the bytes its engine's server has written so far. Pure.

By default (`interval_s` 0) at once: a stream's bytes cross to the Router as the engine writes
them, and coalesce only while the replica is still sending the previous item (the reply's
generator waits at its `yield` meanwhile, so what is written then goes in the next item, as TCP's
autocork does). An idle path adds nothing to a token's latency; a busy one sends fewer, larger
items, by itself.

Each item that crosses a Ray hop costs the sender and the receiver a fixed share of CPU,
whatever it holds (bench/relay_cost.py measures it: bench/results/relay_cost.md). An operator
who would rather spend less of it than send every token may set `interval_s` above 0: at most
one item per interval per stream, whatever was written meanwhile going together. The first bytes
(the response head and the first token) still go at once, and so do the last and bytes written
after a quiet spell longer than the interval: holding back never adds more than `interval_s` to
a token's latency.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlushPolicy:
    interval_s: float = 0.0

    def hold_s(self, now_s: float, last_flush_s: float | None) -> float:
        """How long to hold bytes that are ready at `now_s` before sending them."""
        if last_flush_s is None or self.interval_s <= 0:
            return 0.0
        return max(0.0, last_flush_s + self.interval_s - now_s)
