"""Admission control for one model: an in-flight cap and a bounded priority queue.

Pure policy over plain data. The caller passes the clock in as `now_s` (monotonic
seconds) and acts on the decisions; nothing here awaits, sleeps or does I/O, so the
Router wraps it with asyncio futures and tests drive it with plain floats.

- `offer` a new request: `Admit` (a slot is free), `Queue` (wait for one) or
  `Reject("queue_full", retry_after_s)`. A class with a first-token promise
  (`ttft_objective_s_by_level`) starts only while the promised work in flight leaves an engine
  slot (`engine_slots`); without one it queues only for one of the next slots to free while
  they are freeing, and is refused at once (`queue_wait`) if not, or if its slot comes later
  than the promise.
- `release` a finished request: its slot goes to the queued entries that may now start.
- `poll` expires entries that waited longer than their class's bound ("queue_timeout"):
  `max_queue_wait_s`, or `max_queue_wait_s_by_level` for a base priority it names;
  `set_max_wait_s` moves a level's bound (what a promise leaves once the engine's own time to
  a first token is taken). A promised class queues only if it expects to start within half
  its bound: a wait near the mean times out half the time, a refusal that came late.
- `cancel` drops a queued entry whose client left; `set_capacity` follows live replicas.
- `mark_preemptible` an in-flight entry that can stop and resume later (a tracked stream):
  a newcomer of a promised class that would otherwise wait, or miss its promise, takes the
  slot of the lowest-class such entry below its own, the longest running; that entry waits
  in the queue again, as a new arrival of its class (`Admit.preempted`).

Order: priority_queue.py (class, then arrival, with ageing). Unpromised work never passes a
promised entry that waits.

Reserved slots: the capped class (base priority >= `capped_priority`, batch by default)
holds at most `batch_max_share` of the engines' slots, not of the capacity, which is larger
on purpose (unpromised work in the engines' waiting line refills a finished sequence's slot
at the next step). vLLM's priority scheduling never stops a running sequence: without the
cap an interactive request would wait for a batch one to finish. Of those, at most
`batch_prefill_share` of the slots may be in their prefill at once (prefill_window.py):
`prefills.first_token` ends one's prefill, `start_due` (a few times a second) starts what
time let in. With `batch_waits_for_first_tokens`, no batch request starts while a promised one
is in its prefill (until its first token, its objective at most). Invariant after every call:
every queued entry that could start has started.
How long one would wait: wait_estimate.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from llmserve.policies import wait_estimate
from llmserve.policies.admission_decisions import Admit, Decision, Queue, Reject
from llmserve.policies.prefill_window import PrefillWindow
from llmserve.policies.priority_queue import PriorityQueue, QueueEntry

DEFAULT_PRIORITY_LEVELS: dict[str, int] = {"interactive": 0, "standard": 1, "batch": 2}


class AdmissionPolicy:
    """In-flight cap plus bounded priority queue for one model (see module docstring)."""

    def __init__(
        self,
        *,
        capacity: int,
        max_queue_len: int,
        max_queue_wait_s: float,
        max_queue_wait_s_by_level: Mapping[int, float] | None = None,
        ageing_s: float = 0.0,
        displace_lower_priority: bool = True,
        min_retry_after_s: float = 1.0,
        capped_priority: int | None = None,
        batch_max_share: float = 1.0,
        batch_prefill_share: float = 1.0,
        batch_waits_for_first_tokens: bool = False,
        engine_slots: int | None = None,
        ttft_objective_s_by_level: Mapping[int, float] | None = None,
    ) -> None:
        for name, n in (("capacity", capacity), ("max_queue_len", max_queue_len)):
            if n < 0:
                raise ValueError(f"{name} must be >= 0, got {n}")
        by_level = dict(max_queue_wait_s_by_level or {})
        for name, bound in [("max_queue_wait_s", max_queue_wait_s), *by_level.items()]:
            if not (bound > 0 and math.isfinite(bound)):
                raise ValueError(f"queue wait bound {name} must be > 0 and finite, got {bound}")
        if min_retry_after_s < 0:
            raise ValueError(f"min_retry_after_s must be >= 0, got {min_retry_after_s}")
        if not 0 < batch_max_share <= 1:
            raise ValueError(f"batch_max_share must be in (0, 1], got {batch_max_share}")
        self._capacity = capacity
        self._max_queue_len = max_queue_len
        self._max_queue_wait_s = max_queue_wait_s
        self._max_queue_wait_s_by_level = by_level
        self._displace_lower_priority = displace_lower_priority
        self._min_retry_after_s = min_retry_after_s
        self._capped_priority = capped_priority
        self._batch_max_share = batch_max_share
        self._prefills = PrefillWindow(batch_prefill_share, batch_waits_for_first_tokens)
        self._engine_slots = self._check_engine_slots(engine_slots)
        self._ttft_objective_s_by_level = dict(ttft_objective_s_by_level or {})
        self._in_flight: dict[str, float] = {}  # entry id -> admitted at (s)
        self._in_flight_capped: set[str] = set()
        self._in_flight_promised: set[str] = set()
        self._preemptible: dict[str, int] = {}  # in-flight entry id -> its base priority
        self._queue = PriorityQueue(ageing_s)
        self._mean_service_s: float | None = None
        self._last_release_s: float | None = None

    # -- state, for metrics and tests ------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def engine_slots(self) -> int | None:
        return self._engine_slots

    @property
    def capped_limit(self) -> int:
        """Slots the capped class may hold: its share of the engines' slots (of the capacity
        where that is smaller or the engines' is unknown), at least one; at share 1, the
        whole capacity."""
        if self._batch_max_share >= 1:
            return self._capacity
        return max(1, math.floor(self._slots * self._batch_max_share))

    @property
    def _slots(self) -> int:
        """The engines' slots (the capacity where that is smaller or theirs is unknown)."""
        if self._engine_slots is None:
            return self._capacity
        return min(self._capacity, self._engine_slots)

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def num_queued_by_level(self) -> dict[int, int]:
        return self._queue.num_by_level()

    def is_queued(self, entry_id: str) -> bool:
        return entry_id in self._queue

    def is_in_flight(self, entry_id: str) -> bool:
        return entry_id in self._in_flight

    def queued_in_order(self, now_s: float) -> list[str]:
        """Queued entry ids in the order they would start at `now_s`."""
        return [e.entry_id for e in self._queue.in_order(now_s)]

    def max_wait_s(self, priority: int) -> float:
        """How long an entry of this base priority may wait in the queue."""
        return self._max_queue_wait_s_by_level.get(priority, self._max_queue_wait_s)

    def effective_priority(self, priority: int, waited_s: float) -> int:
        return self._queue.effective_priority(priority, waited_s)

    # -- decisions -------------------------------------------------------------------

    def offer(self, entry_id: str, priority: int, now_s: float, waited_s: float = 0.0) -> Decision:
        """Decide a new request. Call `poll(now_s)` first so expired entries do not count.
        `waited_s`: what it already waited before it got here (in front of the Router), which
        its promise and its class's queue bound count as they count the queue's own wait."""
        if entry_id in self._queue or entry_id in self._in_flight:
            raise ValueError(f"entry {entry_id!r} was already offered")
        entry = self._queue.entry(entry_id, priority, now_s - waited_s)
        objective_s = self._ttft_objective_s_by_level.get(priority)
        if objective_s is not None:
            first_s = self._expected_engine_wait_s(entry, now_s)
            late = first_s is not None and waited_s + first_s > objective_s
            if late or not self._may_start(priority, now_s):
                victim = self._victim(priority)
                if victim is not None:
                    self._preempt(victim, now_s)
                    self._admit(entry_id, priority, now_s)
                    return Admit(entry_id, preempted=victim)
                if late or (first_s is not None and not self._freeing_soon(first_s, now_s)):
                    # Its first token would come after its promise, or no slot frees soon:
                    # refused now, not admitted to miss it nor queued to time out.
                    return Reject(entry_id, "queue_wait", self._retry_after_s(priority))
        # By the invariant, a free slot means that only capped entries over their cap wait.
        if self._may_start(priority, now_s):
            self._admit(entry_id, priority, now_s)
            return Admit(entry_id)
        wait_s = self._expected_wait_s(entry, now_s)
        margin = 1.0 if objective_s is None else 0.5
        if wait_s is not None and waited_s + wait_s > margin * self.max_wait_s(priority):
            # It would time out in the queue anyway: say so now, not after its bound.
            return Reject(entry_id, "queue_wait", self._retry_after_s(priority))
        if len(self._queue) < self._max_queue_len:
            self._queue.push(entry)
            return Queue(entry_id)
        worst = self._queue.worst(now_s) if self._displace_lower_priority else None
        if worst is not None:
            if self._queue.key(entry, now_s) < self._queue.key(worst, now_s):
                self._queue.remove(worst)
                self._queue.push(entry)
                retry_s = self._retry_after_s(worst.priority)
                return Queue(entry_id, Reject(worst.entry_id, "queue_full", retry_s))
        return Reject(entry_id, "queue_full", self._retry_after_s(priority))

    def release(self, entry_id: str, now_s: float) -> list[str]:
        """An admitted request ended: free its slot; return the queued ids that start now.

        Raises KeyError for an id that is not in flight: a double release would otherwise
        let in-flight exceed the capacity.
        """
        admitted_s = self._in_flight.pop(entry_id)
        self._last_release_s = now_s
        self._forget(entry_id)
        service_s = max(0.0, now_s - admitted_s)
        self._mean_service_s = wait_estimate.mean_service_s(self._mean_service_s, service_s)
        return self._start_queued(now_s)

    @property
    def prefills(self) -> PrefillWindow:
        """The capped class's entries in their prefill: tell it of first tokens."""
        return self._prefills

    def start_due(self, now_s: float) -> list[str]:
        """The queued ids that start now: after a first token, or a prefill's estimated end."""
        return self._start_queued(now_s)

    def set_capacity(
        self, capacity: int, now_s: float, engine_slots: int | None = None
    ) -> list[str]:
        """Follow the live replicas (max_ongoing_requests x replicas, or less: the adaptive
        limit, and their engines' max_num_seqs x replicas); return ids that start. A shrink
        never stops running requests: nothing starts until in-flight has dropped below it."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._engine_slots = self._check_engine_slots(engine_slots)
        return self._start_queued(now_s)

    @staticmethod
    def _check_engine_slots(engine_slots: int | None) -> int | None:
        if engine_slots is not None and engine_slots < 0:
            raise ValueError(f"engine_slots must be >= 0, got {engine_slots}")
        return engine_slots

    def set_max_wait_s(self, priority: int, bound_s: float) -> None:
        self._max_queue_wait_s_by_level[priority] = bound_s

    def mark_preemptible(self, entry_id: str, priority: int) -> None:
        """This in-flight entry may give its slot to a more urgent one (until `release`)."""
        if entry_id in self._in_flight:
            self._preemptible[entry_id] = priority

    def cancel(self, entry_id: str) -> bool:
        """Drop a queued entry (its client left). False if it is not queued; an entry that
        already started must be `release`d instead."""
        entry = self._queue.get(entry_id)
        if entry is None:
            return False
        self._queue.remove(entry)
        return True

    def poll(self, now_s: float) -> list[Reject]:
        """Expire entries that have waited longer than their class's bound, oldest first."""
        expired = self._queue.expire(now_s, self.max_wait_s)
        return [
            Reject(e.entry_id, "queue_timeout", self._retry_after_s(e.priority)) for e in expired
        ]

    # -- internals -------------------------------------------------------------------

    def _is_capped(self, priority: int) -> bool:
        return self._capped_priority is not None and priority >= self._capped_priority

    def _is_promised(self, priority: int) -> bool:
        return priority in self._ttft_objective_s_by_level

    def _may_start(self, priority: int, now_s: float) -> bool:
        if len(self._in_flight) >= self._capacity:
            return False
        if self._is_capped(priority) and (
            len(self._in_flight_capped) >= self.capped_limit
            or self._prefills.is_full(self._slots, now_s)
        ):
            return False
        if not self._is_promised(priority):  # and passes no promised entry waiting for a slot
            return not any(self._is_promised(level) for level in self._queue.levels())
        # Promised work goes to the engine only while the promised in flight leave it a slot:
        # behind them (ahead of unpromised work: the engine's priority order) it would wait
        # for a running answer to end, seconds that no estimate here sees.
        return not self._engine_slots or len(self._in_flight_promised) < self._engine_slots

    def _admit(self, entry_id: str, priority: int, now_s: float) -> None:
        self._in_flight[entry_id] = now_s
        if self._is_capped(priority):
            self._in_flight_capped.add(entry_id)
            self._prefills.started(entry_id, now_s)
        if self._is_promised(priority):
            self._in_flight_promised.add(entry_id)
            self._prefills.promised_started(
                entry_id, now_s, self._ttft_objective_s_by_level[priority]
            )

    def _victim(self, priority: int) -> str | None:
        """The preemptible in-flight entry of the lowest class below `priority`, the one
        admitted first; None if there is none."""
        below = [(p, -self._in_flight[e], e) for e, p in self._preemptible.items() if p > priority]
        return max(below)[2] if below else None

    def _preempt(self, entry_id: str, now_s: float) -> None:
        priority = self._preemptible[entry_id]
        del self._in_flight[entry_id]
        self._forget(entry_id)
        self._queue.push(self._queue.entry(entry_id, priority, now_s))

    def _forget(self, entry_id: str) -> None:
        """What an in-flight entry held besides its slot, once it released it."""
        self._in_flight_capped.discard(entry_id)
        self._in_flight_promised.discard(entry_id)
        self._preemptible.pop(entry_id, None)
        self._prefills.drop(entry_id)

    def _start_queued(self, now_s: float) -> list[str]:
        started: list[str] = []
        while self._queue and len(self._in_flight) < self._capacity:
            heads = self._queue.heads(now_s)
            best = next((e for e in heads if self._may_start(e.priority, now_s)), None)
            if best is None:  # capped entries over their share, promised ones without a slot
                break
            self._queue.remove(best)
            self._admit(best.entry_id, best.priority, now_s)
            started.append(best.entry_id)
        return started

    def _expected_wait_s(self, entry: QueueEntry, now_s: float) -> float | None:
        """Seconds until `entry` would start (a capped entry: behind those of its class, on its
        share of the slots)."""
        if self._capacity == 0:
            return None
        capped = self._is_capped(entry.priority)
        ahead = self._queue.num_ahead(entry, now_s, self._is_capped if capped else None)
        slots = self.capped_limit if capped else self._capacity
        if self._engine_slots and self._is_promised(entry.priority):
            slots = min(slots, self._engine_slots)
        return wait_estimate.queue_wait_s(ahead, self._mean_service_s, slots)

    def _expected_engine_wait_s(self, entry: QueueEntry, now_s: float) -> float | None:
        """Seconds until `entry` would have an engine slot (a class with a first-token promise);
        None where the engines' slots are unknown: the queue's own bound then applies alone."""
        if not self._engine_slots:
            return None
        ahead, slots = self._queue.num_ahead(entry, now_s), self._slots
        # Unpromised work in the engines' line waits behind it there: it does not count.
        in_engine = max(min(len(self._in_flight), slots), len(self._in_flight_promised))
        # The slots' holders: the oldest in flight (the engines start their line in order).
        ages = sorted((now_s - t for t in self._in_flight.values()), reverse=True)[:slots]
        return wait_estimate.engine_wait_s(ahead, in_engine, slots, self._mean_service_s, ages)

    def _freeing_soon(self, wait_s: float, now_s: float) -> bool:
        """A promised entry queues only while slots are freeing (one did within the last few
        mean gaps: at a load's onset none has, and the mean service time is still the idle
        one) and for one of the next two slots: slots free in bursts, and a wait estimated a
        second short is a refusal that comes late."""
        gap_s = (self._mean_service_s or 0.0) / max(1, self._engine_slots or 1)
        recent = self._last_release_s is not None and now_s - self._last_release_s <= 4 * gap_s
        return recent and wait_s <= 2 * gap_s

    def _retry_after_s(self, priority: int) -> float:
        return wait_estimate.retry_after_s(
            len(self._queue),
            self._mean_service_s,
            self._capacity,
            self._min_retry_after_s,
            self.max_wait_s(priority),
        )
