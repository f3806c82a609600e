"""Token buckets and tenant limits, driven by a plain-float clock."""

from __future__ import annotations

import random

import pytest

from llmserve.policies.rate_limit import TenantLimiter, TokenBucket, format_duration

# -- TokenBucket ---------------------------------------------------------------------

# (capacity, refill_per_s, [(now_s, amount, allowed, remaining after)])
REFILL_CASES = {
    "starts full, drains, refills at the rate": (
        4,
        2.0,
        [
            (0.0, 4, True, 0.0),
            (0.0, 1, False, 0.0),
            (0.5, 1, True, 0.0),
            (1.0, 2, False, 1.0),
            (1.5, 2, True, 0.0),
        ],
    ),
    "refill stops at capacity": (
        3,
        1.0,
        [(0.0, 3, True, 0.0), (100.0, 3, True, 0.0), (100.0, 1, False, 0.0)],
    ),
    "burst: capacity taken at once, then only the rate": (
        5,
        1.0,
        [
            (0.0, 1, True, 4.0),
            (0.0, 1, True, 3.0),
            (0.0, 1, True, 2.0),
            (0.0, 1, True, 1.0),
            (0.0, 1, True, 0.0),
            (0.0, 1, False, 0.0),
            (0.999, 1, False, 0.999),
            (1.0, 1, True, 0.0),
        ],
    ),
    "fractional amounts": (
        1,
        4.0,
        [(0.0, 0.25, True, 0.75), (0.0, 0.75, True, 0.0), (0.125, 0.5, True, 0.0)],
    ),
    "clock reading older than the last adds nothing": (
        2,
        1.0,
        [(10.0, 2, True, 0.0), (9.0, 1, False, 0.0), (10.5, 1, False, 0.5), (11.0, 1, True, 0.0)],
    ),
    "a refused take takes nothing": (
        10,
        1.0,
        [(0.0, 6, True, 4.0), (0.0, 5, False, 4.0), (0.0, 4, True, 0.0)],
    ),
}


@pytest.mark.parametrize("capacity, refill_per_s, steps", REFILL_CASES.values(), ids=REFILL_CASES)
def test_refill_and_burst(capacity, refill_per_s, steps):
    bucket = TokenBucket(capacity, refill_per_s)
    for now_s, amount, allowed, remaining in steps:
        decision = bucket.try_take(amount, now_s)
        assert decision.allowed is allowed, (now_s, amount)
        assert decision.remaining == pytest.approx(remaining), (now_s, amount)


# (capacity, refill_per_s, first take at 0, then amount asked at now_s, retry_after_s, reset_s)
RETRY_CASES = {
    "one token at 2/s": (10, 2.0, 10, 0.0, 1, 0.5, 5.0),
    "three tokens at 2/s": (10, 2.0, 10, 0.0, 3, 1.5, 5.0),
    "part refilled already": (10, 2.0, 10, 1.0, 3, 0.5, 4.0),
    "slow rate": (60, 1.0, 60, 0.0, 30, 30.0, 60.0),
    "tokens per minute": (600, 10.0, 590, 0.0, 100, 9.0, 59.0),
}


@pytest.mark.parametrize(
    "capacity, refill_per_s, first, now_s, amount, retry_after_s, reset_s",
    RETRY_CASES.values(),
    ids=RETRY_CASES,
)
def test_retry_after_is_exact(capacity, refill_per_s, first, now_s, amount, retry_after_s, reset_s):
    bucket = TokenBucket(capacity, refill_per_s)
    assert bucket.try_take(first, 0.0).allowed
    refused = bucket.try_take(amount, now_s)
    assert not refused.allowed and not refused.exceeds_capacity
    assert refused.retry_after_s == retry_after_s  # not rounded to whole seconds
    assert refused.reset_s == reset_s
    assert not bucket.try_take(amount, now_s + retry_after_s * 0.999).allowed
    assert bucket.try_take(amount, now_s + retry_after_s).allowed


@pytest.mark.parametrize("seed", range(20))
def test_waiting_retry_after_is_always_enough(seed):
    # Awkward floats: waiting exactly retry_after_s must suffice, and waiting
    # visibly less must not, whatever the rounding.
    rng = random.Random(seed)
    bucket = TokenBucket(rng.uniform(1, 1000), rng.uniform(0.01, 100))
    now_s = rng.uniform(0, 1e6)
    for _ in range(50):
        amount = rng.uniform(0.001, bucket.capacity)
        decision = bucket.try_take(amount, now_s)
        if not decision.allowed:
            assert decision.retry_after_s > 0
            if decision.retry_after_s > 1e-3:
                assert not bucket.peek(amount, now_s + decision.retry_after_s * 0.999).allowed
            now_s += decision.retry_after_s
            assert bucket.try_take(amount, now_s).allowed
        now_s += rng.uniform(0, 2)


def test_reset_s_counts_until_full():
    bucket = TokenBucket(10, 2.0)
    assert bucket.try_take(4, 0.0).reset_s == 2.0
    assert bucket.reset_s(1.0) == 1.0
    assert bucket.reset_s(5.0) == 0.0


@pytest.mark.parametrize(
    "capacity, max_amount, amount",
    [
        (10, None, 11),
        (10, None, 10.5),
        (10, 20, 21),
    ],
)
def test_oversized_take_is_never_admissible(capacity, max_amount, amount):
    bucket = TokenBucket(capacity, 1.0, max_amount=max_amount)
    decision = bucket.try_take(amount, 0.0)
    assert not decision.allowed
    assert decision.exceeds_capacity
    assert decision.retry_after_s is None  # no promise that waiting helps
    assert bucket.tokens(1e9) == capacity  # and nothing was taken


def test_take_above_capacity_but_within_max_amount_waits_for_full_then_owes():
    bucket = TokenBucket(5, 1.0, max_amount=10)
    assert bucket.try_take(1, 0.0).allowed
    refused = bucket.try_take(8, 0.0)
    assert not refused.allowed and refused.retry_after_s == 1.0  # until full, not 8 tokens
    granted = bucket.try_take(8, 1.0)
    assert granted.allowed and granted.remaining == -3.0
    assert granted.reset_s == 8.0
    assert not bucket.peek(1, 4.999).allowed and bucket.peek(1, 5.0).allowed


# (reserved, correction, balance after, retry_after_s for 1 token after)
ADJUST_CASES = {
    "usage below reservation returns tokens": (8, +5, 7.0, 0.0),
    "return is capped at capacity": (8, +100, 10.0, 0.0),
    "usage above reservation takes more": (8, -1, 1.0, 0.0),
    "correction can go negative and is waited out": (8, -12, -10.0, 5.5),
    "exact usage changes nothing": (8, 0, 2.0, 0.0),
}


@pytest.mark.parametrize(
    "reserved, correction, balance, retry_after_s", ADJUST_CASES.values(), ids=ADJUST_CASES
)
def test_adjust_corrects_reservation(reserved, correction, balance, retry_after_s):
    bucket = TokenBucket(10, 2.0)
    assert bucket.try_take(reserved, 0.0).allowed
    assert bucket.adjust(correction, 0.0) == balance
    assert bucket.peek(1, 0.0).retry_after_s == retry_after_s


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(capacity=0, refill_per_s=1),
        dict(capacity=1, refill_per_s=0),
        dict(capacity=10, refill_per_s=1, max_amount=5),
    ],
)
def test_bucket_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        TokenBucket(**kwargs)


# -- TenantLimiter -------------------------------------------------------------------


def test_admits_only_when_both_allow_and_refusal_costs_nothing():
    limiter = TenantLimiter(requests_per_s=1, max_burst_requests=2, tokens_per_min=600)
    assert limiter.try_admit(500, 0.0).allowed
    # tokens refuse (100 left): the request bucket must not be charged
    refused = limiter.try_admit(200, 0.0)
    assert not refused.allowed and refused.limited_by == ("tokens",)
    assert refused.retry_after_s == 10.0  # 100 more tokens at 10/s
    assert refused.status.remaining_requests == 1
    # requests refuse: the token bucket must not be charged
    assert limiter.try_admit(50, 0.0).allowed
    refused = limiter.try_admit(10, 0.0)
    assert refused.limited_by == ("requests",) and refused.retry_after_s == 1.0
    assert refused.status.remaining_tokens == 50


def test_retry_after_waits_for_every_refusing_bucket():
    limiter = TenantLimiter(requests_per_s=1, max_burst_requests=1, tokens_per_min=60)
    assert limiter.try_admit(60, 0.0).allowed
    refused = limiter.try_admit(30, 0.0)
    assert refused.limited_by == ("requests", "tokens")
    assert refused.retry_after_s == 30.0  # tokens need 30 s, requests only 1 s
    assert not limiter.try_admit(30, 29.9).allowed
    assert limiter.try_admit(30, 30.0).allowed


def test_request_bigger_than_token_limit_is_flagged_not_retried():
    limiter = TenantLimiter(requests_per_s=10, tokens_per_min=1000)
    decision = limiter.try_admit(1001, 0.0)
    assert not decision.allowed and decision.exceeds_limit
    assert decision.retry_after_s is None
    assert decision.status.remaining_requests == 10  # nothing was charged


# (limiter kwargs, tokens asked at 0, expected header values after admission)
HEADER_CASES = {
    "both limits": (
        dict(requests_per_s=2, max_burst_requests=4, tokens_per_min=600),
        100,
        {
            "x-ratelimit-limit-requests": "4",
            "x-ratelimit-remaining-requests": "3",
            "x-ratelimit-reset-requests": "500ms",
            "x-ratelimit-limit-tokens": "600",
            "x-ratelimit-remaining-tokens": "500",
            "x-ratelimit-reset-tokens": "10s",
        },
    ),
    "requests only, burst defaults to the rate": (
        dict(requests_per_s=5),
        10**9,
        {
            "x-ratelimit-limit-requests": "5",
            "x-ratelimit-remaining-requests": "4",
            "x-ratelimit-reset-requests": "200ms",
        },
    ),
    "tokens only": (
        dict(requests_per_s=None, tokens_per_min=60_000),
        30_000,
        {
            "x-ratelimit-limit-tokens": "60000",
            "x-ratelimit-remaining-tokens": "30000",
            "x-ratelimit-reset-tokens": "30s",
        },
    ),
    "shares report the whole-app view": (
        dict(requests_per_s=2, max_burst_requests=4, tokens_per_min=600, share=0.5),
        100,
        {
            "x-ratelimit-limit-requests": "4",
            "x-ratelimit-remaining-requests": "2",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-limit-tokens": "600",
            "x-ratelimit-remaining-tokens": "400",
            "x-ratelimit-reset-tokens": "20s",
        },
    ),
}


@pytest.mark.parametrize("kwargs, num_tokens, headers", HEADER_CASES.values(), ids=HEADER_CASES)
def test_openai_rate_limit_headers(kwargs, num_tokens, headers):
    decision = TenantLimiter(**kwargs).try_admit(num_tokens, 0.0)
    assert decision.allowed
    assert decision.status.headers() == headers


def test_settle_corrects_tokens_to_actual_usage():
    limiter = TenantLimiter(requests_per_s=100, tokens_per_min=600)
    assert limiter.try_admit(600, 0.0).allowed  # prompt + max_tokens reserved
    limiter.settle(num_reserved_tokens=600, num_used_tokens=150, now_s=0.0)
    assert limiter.status(0.0).remaining_tokens == 450
    limiter.settle(num_reserved_tokens=0, num_used_tokens=550, now_s=0.0)  # ran over
    status = limiter.status(0.0)
    assert status.remaining_tokens == 0 and status.reset_tokens_s == 70.0
    assert limiter.try_admit(1, 0.0).retry_after_s == 10.1
    TenantLimiter(requests_per_s=1).settle(10, 20, 0.0)  # no token limit: nothing to do


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("spread", ["round_robin", "random"])
def test_shares_hold_the_aggregate_rate_across_replicas(num_replicas, spread):
    # A tenant offers 5x its rate, spread over N Router replicas each holding 1/N.
    requests_per_s, max_burst_requests, duration_s = 20.0, 10.0, 60.0
    rng = random.Random(num_replicas)
    replicas = [
        TenantLimiter(
            requests_per_s=requests_per_s,
            max_burst_requests=max_burst_requests,
            share=1 / num_replicas,
        )
        for _ in range(num_replicas)
    ]
    num_admitted, num_offered = 0, int(5 * requests_per_s * duration_s)
    for i in range(num_offered):
        now_s = i * duration_s / num_offered
        replica = replicas[i % num_replicas] if spread == "round_robin" else rng.choice(replicas)
        num_admitted += replica.try_admit(1, now_s).allowed
    ceiling = requests_per_s * duration_s + max_burst_requests
    assert num_admitted <= ceiling
    assert num_admitted >= 0.9 * requests_per_s * duration_s


@pytest.mark.parametrize("num_replicas", [2, 4, 8])
def test_share_smaller_than_one_request_still_admits(num_replicas):
    # burst 1 split 8 ways is 1/8 of a request per replica: it is granted when the
    # slice is full and repaid, rather than flagged as never admissible.
    limiter = TenantLimiter(
        requests_per_s=1, max_burst_requests=1, tokens_per_min=1000, share=1 / num_replicas
    )
    first = limiter.try_admit(1000, 0.0)
    assert first.allowed and not first.exceeds_limit
    refused = limiter.try_admit(1, 0.0)
    assert not refused.allowed and refused.limited_by == ("requests", "tokens")
    share = 1 / num_replicas
    tokens_debt = 1000 - 1000 * share  # paid back before the next token is due
    assert refused.retry_after_s == pytest.approx((tokens_debt + 1) / (1000 / 60 * share))
    assert limiter.try_admit(1000, 0.0).exceeds_limit is False
    assert limiter.try_admit(1001, 0.0).exceeds_limit


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_share_must_be_a_fraction(share):
    with pytest.raises(ValueError):
        TenantLimiter(requests_per_s=1, share=share)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0ms"),
        (0.0004, "1ms"),
        (0.02, "20ms"),
        (0.5, "500ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.999, "59.999s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (61.25, "1m1.25s"),
        (3600, "1h0m0s"),
        (3723, "1h2m3s"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
