"""How long a request would wait, from its admission queue's state: arithmetic over the entries
ahead of it and the mean time a request holds its slot. Pure; llmserve/policies/admission.py
counts the entries and acts on the answers.
"""

from __future__ import annotations

from collections.abc import Sequence

# Weight of the newest completion in the mean service time: it follows load changes within tens
# of requests, and one runaway request barely moves it.
SERVICE_TIME_WEIGHT = 0.1


def moving_mean(mean: float | None, sample: float, weight: float) -> float:
    """An exponential moving mean with one more sample in it, `weight` its share."""
    return sample if mean is None else mean + weight * (sample - mean)


def mean_service_s(mean_s: float | None, service_s: float) -> float:
    """The mean service time with one more completion in it."""
    return moving_mean(mean_s, service_s, SERVICE_TIME_WEIGHT)


def queue_wait_s(ahead: int, mean_s: float | None, slots: int) -> float | None:
    """Seconds until an entry with `ahead` entries before it starts, `slots` of them working the
    line off; None until a completion has been seen, or with no slots."""
    if mean_s is None or slots <= 0:
        return None
    return (ahead + 1) * mean_s / slots


def engine_wait_s(
    ahead: int, num_in_flight: int, slots: int, mean_s: float | None, ages_s: Sequence[float] = ()
) -> float | None:
    """Seconds until an entry has an engine slot: the queued entries ahead of it and the admitted
    ones still in the engines' waiting line (in flight beyond the engines' `slots`) go first,
    one slot freeing every mean service time / slots; and no sooner than the running requests
    (`ages_s`: how long each has run) reach the mean one by one: requests that started in one
    burst end in one, which a rate hides. 0 while a slot is free."""
    if mean_s is None or slots <= 0:
        return None
    in_line = max(0, num_in_flight - slots)
    if ahead + in_line == 0 and num_in_flight < slots:
        return 0.0
    k = ahead + in_line + 1
    left = sorted(max(0.0, mean_s - age) for age in ages_s)
    by_age = left[k - 1] if k <= len(left) else 0.0
    return max(k * mean_s / slots, by_age)


def retry_after_s(
    num_queued: int, mean_s: float | None, capacity: int, min_s: float, max_wait_s: float
) -> float:
    """When a refused client might be served: the time to work off today's queue at the observed
    service rate, within [min_s, its class's wait bound]. Retries spread over that span instead
    of all returning at the next free slot."""
    upper_s = max(min_s, max_wait_s)
    if capacity == 0:
        return upper_s  # nothing drains until replicas come up
    if mean_s is None:
        return min_s  # no completions seen yet: nothing to go by
    return min(upper_s, max(min_s, num_queued * mean_s / capacity))
