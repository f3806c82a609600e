"""An in-flight limit that follows the first-token times the engines give: AIMD on promises.

The fixed cap (`max_ongoing_requests` x replicas) is what a replica may hold, not what it can
serve within a class's first-token promise: that depends on prompt lengths, the engine's
prefill speed and the host, and a replica admitted up to its cap can keep requests for seconds
before their first token (prefill steps batch every waiting prompt; the frontend tokenizes under
load). The wait estimate (wait_estimate.py) cannot see that; the promises kept or missed can.

Each admitted stream is tracked until its first token; one of a class with a promise is due at
its arrival plus its class's objective. Pure; the clock is passed in.

- Decrease: a request past due without a first token (seen on `first_token` or, sooner, on
  `overdue`, so a stalled engine is noticed after the objective, not after the late token)
  multiplies the limit by `decrease`. Once per round: only requests that started after the
  last decrease count, as TCP's congestion window does, since the earlier ones were admitted
  under the old limit. And only a request that started behind others still waiting for their
  first token: one that waited behind no one missed by its own prefill (a long prompt), and
  cutting the limit for it would starve everyone else.
- Increase: a first token within `headroom` of its objective, of a request that started with
  the limit full (the one that made it bind: evidence about the limit, not about the lighter
  load before) and after the last decrease, adds one. Between the two the limit holds, so it
  settles instead of oscillating.
  Streams of a class without a promise (batch) count here only, against the tightest promise:
  that they start fast says the engine has room, that they start late says nothing (no one
  was promised anything), so a batch flood grows the limit while the engine's own line stays
  short and never cuts it.
- Start: at `start_limit`, the engines' slots (`max_num_seqs` x replicas), not the cap: beyond
  them a request waits in the engine's own line for a running one to end, a wait no estimate
  sees at a load's onset (the mean service time is still the idle one). It grows past them as
  first tokens keep coming fast.
- The engine's own time to a first token (from the slot to the token, a moving mean): what a
  promise leaves for the queue. The gate refuses a request that would wait longer than that,
  rather than start it to miss; so a miss here speaks of the engine, not of the queue.
- The line to a first token: `expected_first_s` is when a request starting now would have its
  first token, behind the tracked ones of its class or a more urgent one still waiting for
  theirs, one every mean gap between first tokens while a line waited, over the last seconds
  (the engine's rate of starting requests: prefill batches several, so it is measured). It leads
  where the limit lags: at a load's onset the line grows at once, misses show a promise later.
- Bounds: never below `min_limit` nor above `max_limit` (the configured cap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmserve.policies.wait_estimate import moving_mean

# Weight of the newest sample in the engine's mean time to a first token: it follows a load
# change within a few dozen requests.
MEAN_WEIGHT = 0.2
# The gap between first tokens is a rate over the last seconds (busy time / first tokens, both
# decaying with this time constant), not a mean per sample: one prefill step hands out a dozen
# first tokens at once, and a per-sample mean would read the dozen zero gaps that end each step
# as a fast engine.
GAP_WINDOW_S = 5.0
# Fewer gaps than this in the window (about three, as the window decays them) are no rate: at a
# light load a line of two forms now and then, and one slow prefill in it (an engine's first, a
# long prompt beside a short one) would read as seconds per first token and refuse the next
# short request while nothing waits.
MIN_GAPS = 2.5


@dataclass(frozen=True)
class _Tracked:
    started_s: float
    due_s: float
    objective_s: float
    priority: int
    behind: int  # tracked requests still waiting for their first token when it started
    promised: bool  # its class has a first-token objective (else: `objective_s` is the tightest)
    at_limit: bool  # it started with the limit full


class InFlightLimit:
    def __init__(
        self,
        *,
        min_limit: int,
        max_limit: int,
        start_limit: int | None = None,
        decrease: float = 0.8,
        headroom: float = 0.5,
    ) -> None:
        if not 1 <= min_limit:
            raise ValueError(f"min_limit must be >= 1, got {min_limit}")
        if not 0 < decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {decrease}")
        if not 0 < headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {headroom}")
        self._min = min_limit
        self._max = max(min_limit, max_limit)
        self._decrease = decrease
        self._headroom = headroom
        start = self._max if start_limit is None else start_limit
        self.limit = max(min_limit, min(self._max, start))
        self._share = self.limit / self._max  # of the cap: what set_max keeps
        self._tracked: dict[str, _Tracked] = {}
        self._last_decrease_s = -math.inf
        self.num_decreases = 0
        self.engine_s: float | None = None  # mean seconds from a slot to the first token
        self._line_since_s: float | None = None  # the last first token, if a line waited behind
        self._busy_s = 0.0  # decaying sums: seconds a line waited, first tokens meanwhile
        self._num_firsts = 0.0
        self._sums_at_s = 0.0

    def set_max(self, max_limit: int) -> None:
        """The cap followed the live replicas: the limit keeps its share of it (replicas that
        come serve as the others do), the share it had before any went, even through none."""
        self._max = max(self._min, max_limit)
        self.limit = max(self._min, min(self._max, round(self._share * self._max)))

    def started(
        self,
        entry_id: str,
        priority: int,
        arrival_s: float,
        objective_s: float,
        now_s: float,
        *,
        num_in_flight: int = 0,
        promised: bool = True,
    ) -> None:
        """A stream took its slot, `num_in_flight` with it: of a class with a first-token
        objective (`promised`), or of one without, measured against the tightest objective
        only to grow the limit."""
        due_s = arrival_s + objective_s if promised else math.inf
        self._tracked[entry_id] = _Tracked(
            now_s,
            due_s,
            objective_s,
            priority,
            self._num_promised(),
            promised,
            num_in_flight >= self.limit,
        )

    def _num_promised(self, priority: float = math.inf) -> int:
        return sum(1 for t in self._tracked.values() if t.promised and t.priority <= priority)

    @property
    def gap_s(self) -> float | None:
        """Mean seconds between first tokens while a line waited, over the last seconds."""
        if self._num_firsts < MIN_GAPS:
            return None
        return self._busy_s / self._num_firsts

    def expected_first_s(
        self, priority: int, queued_by_level: dict[int, int] | None = None
    ) -> float | None:
        """Seconds until a request of `priority` arriving now would have its first token, behind
        the queued requests and the started ones of its class or above still waiting for
        theirs; None while nothing is ahead of it, or before any line was seen."""
        queued = sum(n for p, n in (queued_by_level or {}).items() if p <= priority)
        ahead = self._num_promised(priority) + queued
        if self.gap_s is None or ahead == 0:
            return None
        return (ahead + 1) * self.gap_s

    def forget(self, entry_id: str) -> None:
        """It ended (or was never tracked): nothing more to learn from it."""
        self._tracked.pop(entry_id, None)
        if not self._num_promised():
            self._line_since_s = None  # the line is gone: the time until the next one is no gap

    def first_token(self, entry_id: str, now_s: float) -> bool:
        """Its first token came; True if the limit changed."""
        t = self._tracked.pop(entry_id, None)
        if t is None:
            return False
        if not t.promised:
            return self._grow(t, now_s - t.started_s)
        self.engine_s = moving_mean(self.engine_s, now_s - t.started_s, MEAN_WEIGHT)
        if self._line_since_s is not None:
            keep = math.exp(-max(0.0, now_s - self._sums_at_s) / GAP_WINDOW_S)
            self._busy_s = self._busy_s * keep + (now_s - self._line_since_s)
            self._num_firsts = self._num_firsts * keep + 1
            self._sums_at_s = now_s
        self._line_since_s = now_s if self._num_promised() else None
        if now_s > t.due_s:
            return self._late(t, now_s)
        return self._grow(t, now_s - (t.due_s - t.objective_s))

    def _grow(self, t: _Tracked, waited_s: float) -> bool:
        fast = waited_s <= self._headroom * t.objective_s
        this_round = t.started_s > self._last_decrease_s
        if fast and t.at_limit and this_round and self.limit < self._max:
            self.limit += 1
            self._share = self.limit / self._max
            return True
        return False

    def overdue(self, now_s: float) -> bool:
        """Requests past due still without a first token; True if the limit changed."""
        return any(self._late(t, now_s) for t in list(self._tracked.values()) if now_s > t.due_s)

    def _late(self, t: _Tracked, now_s: float) -> bool:
        if t.behind == 0 or t.started_s <= self._last_decrease_s or self.limit <= self._min:
            return False
        self.limit = max(self._min, math.floor(self.limit * self._decrease))
        self._share = self.limit / self._max
        # Whatever started until now was admitted under the old limit: it ends this round.
        self._last_decrease_s = now_s
        self.num_decreases += 1
        return True
