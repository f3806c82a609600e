"""Which models cannot serve yet (llmserve/policies/readiness.py), as a table."""

from __future__ import annotations

import pytest

from llmserve.policies.readiness import NONE_RUNNING, NOT_KNOWN, not_ready


@pytest.mark.parametrize(
    "case, live_replicas, may_scale_to_zero, expected",
    [
        ("nothing known yet", {}, set(), {"a": NOT_KNOWN, "b": NOT_KNOWN}),
        ("one known, running", {"a": 1}, set(), {"b": NOT_KNOWN}),
        ("all running", {"a": 1, "b": 3}, set(), {}),
        ("a replica died, none left", {"a": 0, "b": 1}, set(), {"a": NONE_RUNNING}),
        ("both down", {"a": 0, "b": 0}, set(), {"a": NONE_RUNNING, "b": NONE_RUNNING}),
        # Allowed to scale to zero: ready with none, its first request starts one.
        ("scaled to zero", {"a": 0, "b": 1}, {"a"}, {}),
        ("scale-to-zero, count unknown", {"b": 1}, {"a"}, {}),
        ("only the other one waits", {"a": 0}, {"a"}, {"b": NOT_KNOWN}),
        # A count for a model not served here changes nothing.
        ("a stranger's count", {"a": 1, "b": 1, "c": 0}, set(), {}),
    ],
)
def test_not_ready(case, live_replicas, may_scale_to_zero, expected):
    assert not_ready(["a", "b"], live_replicas, may_scale_to_zero) == expected, case


def test_no_models_is_ready():
    assert not_ready([], {"a": 0}, set()) == {}
