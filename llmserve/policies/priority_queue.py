"""The admission queue's order (llmserve/policies/admission.py decides who enters and leaves).

Lower priority number first (interactive=0, standard=1, batch=2 by default), then arrival; with
ageing, an entry's effective priority drops by one every `ageing_s` seconds it waits, so batch
work passes newer interactive work after long enough and is never starved.

One FIFO per base priority. Ageing depends only on the wait, so within one base priority the
oldest entry is always the most urgent: the next to start is the best of the heads, the one to
displace the worst of the tails. Pure: the caller passes the clock in.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueEntry:
    entry_id: str
    priority: int  # its base priority (its class's level)
    arrival_s: float
    seq: int  # arrival order, so ties never depend on clock resolution


class PriorityQueue:
    def __init__(self, ageing_s: float = 0.0) -> None:
        if ageing_s < 0:
            raise ValueError(f"ageing_s must be >= 0 (0 = off), got {ageing_s}")
        self._ageing_s = ageing_s
        self._entries: dict[str, QueueEntry] = {}
        self._levels: dict[int, OrderedDict[str, QueueEntry]] = {}
        self._seq = itertools.count()

    def entry(self, entry_id: str, priority: int, now_s: float) -> QueueEntry:
        """A new arrival (not queued yet: `push` it)."""
        return QueueEntry(entry_id, priority, now_s, next(self._seq))

    def effective_priority(self, priority: int, waited_s: float) -> int:
        if self._ageing_s <= 0:
            return priority
        return priority - math.floor(max(0.0, waited_s) / self._ageing_s)

    def key(self, entry: QueueEntry, now_s: float) -> tuple[int, int]:
        """Smaller starts first."""
        return self.effective_priority(entry.priority, now_s - entry.arrival_s), entry.seq

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._entries

    def get(self, entry_id: str) -> QueueEntry | None:
        return self._entries.get(entry_id)

    def levels(self) -> Iterable[int]:
        """The base priorities of the entries waiting."""
        return self._levels.keys()

    def num_by_level(self) -> dict[int, int]:
        return {level: len(fifo) for level, fifo in sorted(self._levels.items())}

    def push(self, entry: QueueEntry) -> None:
        self._entries[entry.entry_id] = entry
        self._levels.setdefault(entry.priority, OrderedDict())[entry.entry_id] = entry

    def remove(self, entry: QueueEntry) -> None:
        del self._entries[entry.entry_id]
        fifo = self._levels[entry.priority]
        del fifo[entry.entry_id]
        if not fifo:
            del self._levels[entry.priority]

    def heads(self, now_s: float) -> list[QueueEntry]:
        """Each level's oldest entry, the one to start first first."""
        heads = (fifo[next(iter(fifo))] for fifo in self._levels.values())
        return sorted(heads, key=lambda e: self.key(e, now_s))

    def worst(self, now_s: float) -> QueueEntry | None:
        """The entry that would start last (the one to displace)."""
        tails = [fifo[next(reversed(fifo))] for fifo in self._levels.values()]
        return max(tails, key=lambda e: self.key(e, now_s)) if tails else None

    def in_order(self, now_s: float) -> list[QueueEntry]:
        return sorted(self._entries.values(), key=lambda e: self.key(e, now_s))

    def num_ahead(
        self, entry: QueueEntry, now_s: float, counts: Callable[[int], bool] | None = None
    ) -> int:
        """Entries that would start before `entry` (of a base priority `counts` accepts)."""
        key = self.key(entry, now_s)
        return sum(
            1
            for e in self._entries.values()
            if self.key(e, now_s) < key and (counts is None or counts(e.priority))
        )

    def expire(self, now_s: float, bound_s: Callable[[int], float]) -> list[QueueEntry]:
        """Remove and return the entries that waited longer than their level's bound, oldest
        first."""
        expired: list[QueueEntry] = []
        for priority, fifo in list(self._levels.items()):
            # Each FIFO is in arrival order with one bound, so its expired entries are a prefix.
            while fifo:
                head = fifo[next(iter(fifo))]
                if now_s - head.arrival_s <= bound_s(priority):
                    break
                self.remove(head)
                expired.append(head)
        return sorted(expired, key=lambda e: e.seq)
