"""How many requests of the capped class (batch) are in their prefill at once.

An engine runs the prefill chunks of the requests it has admitted before anything still
waiting (vLLM's scheduler serves its running list first, whatever the priority), so a wave of
batch requests admitted together delays every first token behind it by the wave's whole
prefill; and batch answers that start together end together, so the waves come back. Holding
batch starts to a few prefills at a time spreads them out, while batch keeps its slots
(docs/admission.md, "Batch prefills").

A request is in its prefill from its start until its first token. A stream's first token the
Router sees (`first_token`); a non-streamed answer's it does not, so such a request counts for
the mean prefill time measured on streams (`unseen_first_token`), and not at all before one
was measured. Pure: the caller passes the clock in.

And while a request of a class with a first-token promise is in its prefill, no batch request
starts (`yield_to_promised`): a batch prefill admitted beside it shares its steps and delays its
first token by that prefill (on a CPU a 128-token prefill is most of a step). Its hold ends at
its first token, or after `hold_s` (its class's objective: a prefill that long has missed its
promise anyway, and batch should not wait on it longer).
"""

from __future__ import annotations

import math

from llmserve.policies import wait_estimate

UNTIL_FIRST_TOKEN = math.inf


class PrefillWindow:
    """The capped class's entries in their prefill, each until its first token."""

    def __init__(self, share: float, yield_to_promised: bool = False) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"batch_prefill_share must be in (0, 1], got {share}")
        self._share = share
        self._yield = yield_to_promised
        self._until: dict[str, float] = {}  # entry id -> when its prefill ends (inf: unseen yet)
        self._promised_until: dict[str, float] = {}  # promised entries: when their hold ends
        self._started_s: dict[str, float] = {}
        self._mean_prefill_s: float | None = None

    def limit(self, slots: int) -> int | None:
        """How many may be in their prefill at once, of `slots` engine slots; None: no bound."""
        return None if self._share >= 1 else max(1, math.floor(slots * self._share))

    def is_full(self, slots: int, now_s: float) -> bool:
        """No batch request may start now."""
        limit = self.limit(slots)
        if limit is None and not self._yield:
            return False  # nothing bounds batch starts: no need to walk the entries
        self._expire(now_s)
        if self._promised_until:
            return True
        return limit is not None and len(self._until) >= limit

    def promised_started(self, entry_id: str, now_s: float, hold_s: float) -> None:
        """A request of a class with a first-token promise started: batch starts wait for its
        first token, `hold_s` at most (nothing, unless `yield_to_promised`)."""
        if self._yield:
            self._promised_until[entry_id] = now_s + hold_s

    def started(self, entry_id: str, now_s: float) -> None:
        self._until[entry_id] = UNTIL_FIRST_TOKEN
        self._started_s[entry_id] = now_s

    def first_token(self, entry_id: str, now_s: float) -> None:
        """A stream's first token: its prefill is over, and it says how long one takes."""
        self._promised_until.pop(entry_id, None)
        started_s = self._started_s.pop(entry_id, None)
        if self._until.pop(entry_id, None) is not None and started_s is not None:
            sample = max(0.0, now_s - started_s)
            self._mean_prefill_s = wait_estimate.mean_service_s(self._mean_prefill_s, sample)

    def unseen_first_token(self, entry_id: str, now_s: float) -> None:
        """A request whose first token the caller will not see: it counts for a mean prefill."""
        if entry_id in self._promised_until:
            if self._mean_prefill_s is None:
                del self._promised_until[entry_id]
            else:
                hold_until_s = min(self._promised_until[entry_id], now_s + self._mean_prefill_s)
                self._promised_until[entry_id] = hold_until_s
        if entry_id in self._until:
            if self._mean_prefill_s is None:
                self.drop(entry_id)
            else:
                self._until[entry_id] = now_s + self._mean_prefill_s

    def drop(self, entry_id: str) -> None:
        """It ended, or stopped (preempted): no longer in its prefill, nothing learnt."""
        self._until.pop(entry_id, None)
        self._started_s.pop(entry_id, None)
        self._promised_until.pop(entry_id, None)

    def __len__(self) -> int:
        return len(self._until)

    def _expire(self, now_s: float) -> None:
        for entry_id in [e for e, until_s in self._until.items() if until_s <= now_s]:
            self.drop(entry_id)
        for entry_id in [e for e, until_s in self._promised_until.items() if until_s <= now_s]:
            del self._promised_until[entry_id]
