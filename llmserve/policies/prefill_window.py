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
"""

from __future__ import annotations

import math

from llmserve.policies import wait_estimate

UNTIL_FIRST_TOKEN = math.inf


class PrefillWindow:
    """The capped class's entries in their prefill, each until its first token."""

    def __init__(self, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"batch_prefill_share must be in (0, 1], got {share}")
        self._share = share
        self._until: dict[str, float] = {}  # entry id -> when its prefill ends (inf: unseen yet)
        self._started_s: dict[str, float] = {}
        self._mean_prefill_s: float | None = None

    def limit(self, slots: int) -> int | None:
        """How many may be in their prefill at once, of `slots` engine slots; None: no bound."""
        return None if self._share >= 1 else max(1, math.floor(slots * self._share))

    def is_full(self, slots: int, now_s: float) -> bool:
        limit = self.limit(slots)
        if limit is None:
            return False
        self._expire(now_s)
        return len(self._until) >= limit

    def started(self, entry_id: str, now_s: float) -> None:
        self._until[entry_id] = UNTIL_FIRST_TOKEN
        self._started_s[entry_id] = now_s

    def first_token(self, entry_id: str, now_s: float) -> None:
        """A stream's first token: its prefill is over, and it says how long one takes."""
        started_s = self._started_s.pop(entry_id, None)
        if self._until.pop(entry_id, None) is not None and started_s is not None:
            sample = max(0.0, now_s - started_s)
            self._mean_prefill_s = wait_estimate.mean_service_s(self._mean_prefill_s, sample)

    def unseen_first_token(self, entry_id: str, now_s: float) -> None:
        """A request whose first token the caller will not see: it counts for a mean prefill."""
        if entry_id in self._until:
            if self._mean_prefill_s is None:
                self.drop(entry_id)
            else:
                self._until[entry_id] = now_s + self._mean_prefill_s

    def drop(self, entry_id: str) -> None:
        """It ended, or stopped (preempted): no longer in its prefill, nothing learnt."""
        self._until.pop(entry_id, None)
        self._started_s.pop(entry_id, None)

    def __len__(self) -> int:
        return len(self._until)

    def _expire(self, now_s: float) -> None:
        for entry_id in [e for e, until_s in self._until.items() if until_s <= now_s]:
            self.drop(entry_id)
