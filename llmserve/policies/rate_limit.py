"""Token-bucket rate limits: a pure policy.

Plain numbers in, decisions out. The caller passes the clock in as `now_s` (any monotonic
seconds, e.g. `time.monotonic()`), so tests drive time with plain floats and nothing here
sleeps, locks or does I/O. Not thread-safe: the Router calls it from its one event loop.

`TokenBucket` is one bucket; `TenantLimiter` holds one tenant's requests-per-second and
tokens-per-minute buckets and gives the values of OpenAI's `x-ratelimit-*` headers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Refill is computed from a difference of clock readings, so a caller that waits exactly
# retry_after_s can land a few ulps short of the amount. This slack keeps retry_after_s
# honest (waiting it is always enough) without rounding it up.
_RELATIVE_SLACK = 1e-9


@dataclass(frozen=True)
class TakeDecision:
    """What one bucket says about taking `amount` tokens at `now_s`."""

    allowed: bool
    # Tokens left after this call; negative while a usage correction is being paid back.
    remaining: float
    # 0 when allowed; seconds until the bucket holds enough otherwise (exact, not rounded:
    # the HTTP layer rounds up for Retry-After); None when never admissible.
    retry_after_s: float | None
    # Seconds until the bucket is full again, as things stand after this call.
    reset_s: float
    # The amount exceeds what this bucket can ever grant: waiting will not help.
    exceeds_capacity: bool = False


class TokenBucket:
    """A bucket of `capacity` tokens refilled at `refill_per_s`, starting full.

    `max_amount` (default: capacity) is the largest single take that is ever admissible.
    When it is above the capacity, a take larger than the capacity is granted once the
    bucket is full and drives the balance negative; the debt is refilled before anything
    else passes, so the long-run rate still holds. TenantLimiter uses that for replica
    shares, where one replica's slice of the bucket can be smaller than one request.
    """

    def __init__(
        self, capacity: float, refill_per_s: float, max_amount: float | None = None
    ) -> None:
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        if not refill_per_s > 0:
            raise ValueError(f"refill_per_s must be > 0, got {refill_per_s}")
        if max_amount is not None and max_amount < capacity:
            raise ValueError(f"max_amount ({max_amount}) must be >= capacity ({capacity})")
        self._capacity = float(capacity)
        self._refill_per_s = float(refill_per_s)
        self._max_amount = float(capacity if max_amount is None else max_amount)
        self._tokens = self._capacity
        self._last_s: float | None = None  # None: never read, so still full

    @property
    def capacity(self) -> float:
        return self._capacity

    @property
    def refill_per_s(self) -> float:
        return self._refill_per_s

    @property
    def max_amount(self) -> float:
        return self._max_amount

    def tokens(self, now_s: float) -> float:
        """The balance at `now_s` (may be negative while a debt is refilled)."""
        self._refill(now_s)
        return self._tokens

    def reset_s(self, now_s: float) -> float:
        """Seconds from `now_s` until the bucket is full again."""
        self._refill(now_s)
        return (self._capacity - self._tokens) / self._refill_per_s

    def peek(self, amount: float, now_s: float) -> TakeDecision:
        """The decision try_take would give, without taking anything."""
        self._refill(now_s)
        if amount > self._max_amount:
            return TakeDecision(False, self._tokens, None, self._reset_after(), True)
        # The full amount is needed, except that an oversized-but-admissible take only
        # waits for a full bucket (see the class docstring).
        needed = min(amount, self._capacity)
        if self._tokens + _RELATIVE_SLACK * max(1.0, self._capacity) >= needed:
            return TakeDecision(True, self._tokens - amount, 0.0, self._reset_after(amount))
        retry_after_s = (needed - self._tokens) / self._refill_per_s
        return TakeDecision(False, self._tokens, retry_after_s, self._reset_after())

    def try_take(self, amount: float, now_s: float) -> TakeDecision:
        """Take `amount` tokens if the bucket allows it now; never takes part of it."""
        decision = self.peek(amount, now_s)
        if decision.allowed:
            self._tokens -= amount
        return decision

    def adjust(self, amount: float, now_s: float) -> float:
        """Correct an earlier take: positive returns tokens, negative takes more.

        Returns are capped at the capacity (the bucket may have refilled meanwhile);
        extra takes are never refused, because the usage already happened: they can drive
        the balance negative, which later takes then wait out. Returns the new balance.
        """
        self._refill(now_s)
        self._tokens = min(self._capacity, self._tokens + amount)
        return self._tokens

    def _reset_after(self, amount: float = 0.0) -> float:
        return (self._capacity - (self._tokens - amount)) / self._refill_per_s

    def _refill(self, now_s: float) -> None:
        if self._last_s is None:
            self._last_s = now_s
            return
        # A clock reading older than the last one (callers racing to read it) adds nothing
        # rather than removing tokens.
        elapsed_s = now_s - self._last_s
        if elapsed_s > 0:
            self._tokens = min(self._capacity, self._tokens + elapsed_s * self._refill_per_s)
            self._last_s = now_s


@dataclass(frozen=True)
class RateLimitStatus:
    """Values for OpenAI's x-ratelimit-* headers, whole-app view; None where unlimited."""

    limit_requests: int | None
    remaining_requests: int | None
    reset_requests_s: float | None
    limit_tokens: int | None
    remaining_tokens: int | None
    reset_tokens_s: float | None

    def headers(self) -> dict[str, str]:
        """The x-ratelimit-* headers, in OpenAI's format (reset as e.g. "1s", "6m0s")."""
        out: dict[str, str] = {}
        for kind in ("requests", "tokens"):
            limit = getattr(self, f"limit_{kind}")
            if limit is None:
                continue
            out[f"x-ratelimit-limit-{kind}"] = str(limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(getattr(self, f"remaining_{kind}"))
            out[f"x-ratelimit-reset-{kind}"] = format_duration(getattr(self, f"reset_{kind}_s"))
        return out


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: "250ms", "1s", "1.5s", "6m0s", "1h0m0s" (rounded up to 1 ms)."""
    num_ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if num_ms < 1000:
        return f"{num_ms}ms"
    num_hours, num_ms = divmod(num_ms, 3_600_000)
    num_minutes, num_ms = divmod(num_ms, 60_000)
    secs = f"{num_ms / 1000:.3f}".rstrip("0").rstrip(".")
    if num_hours:
        return f"{num_hours}h{num_minutes}m{secs}s"
    if num_minutes:
        return f"{num_minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True)
class LimitDecision:
    """A tenant's admission decision for one request."""

    allowed: bool
    # Which buckets refused: () when allowed, else some of ("requests", "tokens").
    limited_by: tuple[str, ...]
    # 0 when allowed; seconds until every refusing bucket allows it (exact); None when
    # never admissible.
    retry_after_s: float | None
    # The request alone is bigger than the tenant's limit: answer it as a bad request,
    # not with a Retry-After that would never come true.
    exceeds_limit: bool
    status: RateLimitStatus


class TenantLimiter:
    """One tenant's limits: requests per second (with a burst) and tokens per minute.

    A request is admitted only when both buckets allow it, and then takes from both; when
    either refuses, neither is touched, so a refused request costs the tenant nothing.
    Tokens are reserved at admission as prompt + max_tokens and corrected by `settle` to
    the actual usage at the end. None for a limit means unlimited.

    Several Router replicas: each replica builds its limiter with `share=1/N` for N Router
    replicas, so each holds 1/N of the rate and 1/N of the burst. Why this and not one
    shared counter: it needs no cross-replica round trip on every request (no actor or
    store on the hot path, nothing to fail or to wait on), and the shares sum to exactly
    the configured limit, so the app-wide admitted rate can never exceed it, however the
    requests are spread. Ray Serve spreads requests over Router replicas about evenly, so
    a tenant sending more than its limit is admitted close to the full limit; one that
    lands unevenly gets somewhat less, never more. The headers report the whole-app view:
    limits as configured, and remaining as this replica's balance divided by its share,
    an estimate that is exact when the spread is even. A single request may still use up
    to the whole-app limit: a replica grants it once its slice is full and then pays the
    debt back (see TokenBucket's max_amount). If N changes, build new limiters.
    """

    def __init__(
        self,
        *,
        requests_per_s: float | None,
        max_burst_requests: float | None = None,
        tokens_per_min: float | None = None,
        share: float = 1.0,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._share = share
        self._requests: TokenBucket | None = None
        self._tokens: TokenBucket | None = None
        if requests_per_s is not None:
            if max_burst_requests is None:
                max_burst_requests = max(1.0, requests_per_s)
            if max_burst_requests < 1:
                raise ValueError(f"max_burst_requests must be >= 1, got {max_burst_requests}")
            self._requests = TokenBucket(
                capacity=max_burst_requests * share,
                refill_per_s=requests_per_s * share,
                max_amount=max_burst_requests,
            )
        if tokens_per_min is not None:
            self._tokens = TokenBucket(
                capacity=tokens_per_min * share,
                refill_per_s=tokens_per_min / 60.0 * share,
                max_amount=tokens_per_min,
            )

    @property
    def share(self) -> float:
        return self._share

    def try_admit(self, num_tokens: int, now_s: float) -> LimitDecision:
        """Admit one request reserving `num_tokens` (prompt + max_tokens), or say why not."""
        checks = [
            (kind, bucket, amount, bucket.peek(amount, now_s))
            for kind, bucket, amount in (
                ("requests", self._requests, 1),
                ("tokens", self._tokens, num_tokens),
            )
            if bucket is not None
        ]
        refused = [(kind, d) for kind, _, _, d in checks if not d.allowed]
        if not refused:
            for _, bucket, amount, _ in checks:
                bucket.try_take(amount, now_s)
            return LimitDecision(True, (), 0.0, False, self.status(now_s))
        exceeds_limit = any(d.exceeds_capacity for _, d in refused)
        retry_after_s = None if exceeds_limit else max(d.retry_after_s for _, d in refused)
        return LimitDecision(
            False,
            tuple(kind for kind, _ in refused),
            retry_after_s,
            exceeds_limit,
            self.status(now_s),
        )

    def peek_request(self, now_s: float) -> LimitDecision:
        """Whether the request bucket has room for one more, taking nothing: checked before a
        request's body is read, so that a flood is refused for the price of its headers."""
        if self._requests is None:
            return LimitDecision(True, (), 0.0, False, self.status(now_s))
        d = self._requests.peek(1, now_s)
        if d.allowed:
            return LimitDecision(True, (), 0.0, False, self.status(now_s))
        return LimitDecision(
            False, ("requests",), d.retry_after_s, d.exceeds_capacity, self.status(now_s)
        )

    def settle(self, num_reserved_tokens: int, num_used_tokens: int, now_s: float) -> None:
        """Correct an admitted request's reservation to its actual usage.

        Call once per admitted request when it ends, however it ends: a request that never
        reached the engine (queue full, timeout, client gone) settles with 0 used.
        """
        if self._tokens is not None:
            self._tokens.adjust(num_reserved_tokens - num_used_tokens, now_s)

    def status(self, now_s: float) -> RateLimitStatus:
        """The x-ratelimit-* values at `now_s`, for every response (allowed or not)."""
        requests = self._bucket_status(self._requests, now_s)
        tokens = self._bucket_status(self._tokens, now_s)
        return RateLimitStatus(*requests, *tokens)

    def _bucket_status(
        self, bucket: TokenBucket | None, now_s: float
    ) -> tuple[int | None, int | None, float | None]:
        if bucket is None:
            return None, None, None
        limit = round(bucket.max_amount)  # built as the whole-app limit, unscaled by share
        remaining = min(limit, max(0, math.floor(bucket.tokens(now_s) / self._share + 1e-9)))
        return limit, remaining, bucket.reset_s(now_s)
