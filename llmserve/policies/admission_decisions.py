"""What admission decides for one request (llmserve/policies/admission.py decides it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# queue_wait: refused on arrival because its expected wait already exceeds its wait bound.
RejectReason = Literal["queue_full", "queue_timeout", "queue_wait", "cold_start"]


@dataclass(frozen=True)
class Admit:
    """Start this request now: it holds one in-flight slot until `release`.

    `preempted`: the in-flight entry of a lower class whose slot it took. That entry is queued
    again (its stream must stop now, and resume where it stopped when it starts again)."""

    entry_id: str
    preempted: str | None = None


@dataclass(frozen=True)
class Reject:
    """Answer this request 503 with Retry-After (an estimate, in seconds, not rounded)."""

    entry_id: str
    reason: RejectReason
    retry_after_s: float


@dataclass(frozen=True)
class Queue:
    """This request waits; a later `release`/`set_capacity` starts it or `poll` expires it.
    `displaced`: the least urgent, newest entry of a full queue, rejected to make room for this
    more urgent one; the caller answers it too."""

    entry_id: str
    displaced: Reject | None = None


Decision = Admit | Queue | Reject
