"""The Router's relay decisions, pure: whether a forwarded request is retried before its first
output, whether its time is up when its reply starts, what its deadline asks of a request in
flight, and what a finished reply costs its tenant.

llmserve/router/reply_relay.py and llmserve/router/router.py act on them: Ray calls, cancellation
and errors stay there; the rules are here, table-tested in tests/unit/test_relay_rules.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

MAX_ATTEMPTS = 2  # a replica that fails before any output costs one retry on another
RECLAIM_GRACE_S = 5.0
# Cancelling a Serve call is best effort (a cancel that lands between the replica's assignment
# and the first read is dropped): past its deadline by this much, a request still without its
# reply head is answered 504 whatever its replica does.
HEAD_GRACE_S = 2.0


class Attempt(Enum):
    """How one attempt to get a reply head ended."""

    HEAD = "head"  # the reply started: relay it
    FAILED = "failed"  # the replica (or the call) failed before any output
    UNHEALTHY = "unhealthy"  # the replica refused it before doing any work


class Next(Enum):
    RELAY = "relay"  # relay the reply
    RETRY = "retry"  # send the request again, to another replica
    GIVE_UP = "give_up"  # answer 503


@dataclass(frozen=True)
class AfterAttempt:
    next: Next
    avoid_replica: str | None = None  # on RETRY: the replica the request router must skip
    code: str | None = None  # on GIVE_UP: the 503's error code (None: the status is the code)


def after_attempt(attempt: int, outcome: Attempt, replica_id: str = "") -> AfterAttempt:
    """Nothing reached the client yet, so a failed attempt may be tried again elsewhere. A
    refusing replica is skipped on the retry: it holds nothing, so it scores best until it
    exits. A failure without a head skips none: its replica is gone or will be."""
    if outcome is Attempt.HEAD:
        return AfterAttempt(Next.RELAY)
    if attempt < MAX_ATTEMPTS:
        avoid = replica_id if outcome is Attempt.UNHEALTHY and replica_id else None
        return AfterAttempt(Next.RETRY, avoid_replica=avoid)
    code = "replica_unhealthy" if outcome is Attempt.UNHEALTHY else None
    return AfterAttempt(Next.GIVE_UP, code=code)


class Deadline(Enum):
    """What the housekeeping tick does with one request in flight."""

    KEEP = "keep"
    FORGET = "forget"  # it finished: stop tracking it
    EXPIRE = "expire"  # its deadline passed: cancel it (the engine aborts it, the reader 504s)
    RECLAIM = "reclaim"  # expired and still here after the grace: nobody reads it, free its slot


def past_deadline(now_s: float, deadline_s: float, expired: bool) -> bool:
    """Whether a request's time is up when its reply head arrives: its deadline passed, or the
    housekeeping tick already expired it (the tick runs every 100 ms, so the head can come
    first)."""
    return expired or now_s > deadline_s


def head_wait_s(now_s: float, deadline_s: float, grace_s: float = HEAD_GRACE_S) -> float:
    """How long a dispatched request waits for its reply head: its deadline, then the grace in
    which the deadline's cancellation ends it the usual way."""
    return max(0.0, deadline_s - now_s) + grace_s


def deadline_action(
    now_s: float,
    deadline_s: float,
    finished: bool,
    expired: bool,
    grace_s: float = RECLAIM_GRACE_S,
) -> Deadline:
    """A reply whose body was never iterated (its client left between the headers and the
    first read) never runs its own cleanup: the grace after the deadline bounds how long its
    slot and reservation stay taken."""
    if finished:
        return Deadline.FORGET
    if now_s > deadline_s and not expired:
        return Deadline.EXPIRE
    if now_s > deadline_s + grace_s:
        return Deadline.RECLAIM
    return Deadline.KEEP


def tokens_charged(used_tokens: int | None, num_reserved_tokens: int, replica_failed: bool) -> int:
    """What a finished reply takes from its tenant's token bucket. `used_tokens` is the usage
    the replica counted, None when the reply was cut short: then a client that left (or ran
    out of time) pays what it reserved, so leaving is no way around the limit, and a replica's
    failure costs the tenant nothing."""
    if used_tokens is not None:
        return used_tokens
    return 0 if replica_failed else num_reserved_tokens
