"""A class's first-token promise (admission.ttft_objective_s_by_class): which finished requests
met it and which missed it, as llmserve/observability/metrics.py counts them
(llmserve_ttft_objective_total), and the config's checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.config.admission_config import AdmissionConfig
from llmserve.observability.metrics import RequestOutcome


def outcome(**kw) -> RequestOutcome:
    base = dict(model="m", tenant="t", priority="interactive", outcome="ok", code="", e2e_s=3.0)
    return RequestOutcome(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "result"),
    [
        (dict(ttft_s=0.4, queue_wait_s=0.0, ttft_objective_s=1.0), "met"),
        (dict(ttft_s=1.0, queue_wait_s=0.0, ttft_objective_s=1.0), "met"),  # on the bound
        (dict(ttft_s=1.5, queue_wait_s=0.9, ttft_objective_s=1.0), "missed"),
        # 0.8 s at the Router, after 0.3 s from HAProxy to it: the client waited 1.1 s.
        (dict(ttft_s=0.8, queue_wait_s=0.0, edge_wait_s=0.3, ttft_objective_s=1.0), "missed"),
        (dict(ttft_s=0.8, queue_wait_s=0.0, edge_wait_s=0.2, ttft_objective_s=1.0), "met"),
        # Admitted, then a 504 before any token: the promise was not kept.
        (dict(outcome="504", queue_wait_s=0.1, ttft_objective_s=1.0), "missed"),
        # Refused at admission (no queue wait): an answer at once, counted as a rejection.
        (dict(outcome="503", ttft_objective_s=1.0), None),
        # Its client left before the first token: nothing to judge.
        (dict(outcome="cancelled", queue_wait_s=0.1, ttft_objective_s=1.0), None),
        (dict(ttft_s=30.0, queue_wait_s=0.0), None),  # a class without a promise (batch)
    ],
)
def test_which_requests_met_their_class_s_first_token_promise(kw, result):
    assert outcome(**kw).objective == result


def test_objectives_name_known_classes():
    cfg = AdmissionConfig(ttft_objective_s_by_class={"interactive": 1, "standard": 2})
    assert cfg.ttft_objective_s_by_class == {"interactive": 1.0, "standard": 2.0}
    with pytest.raises(ValidationError, match="ttft_objective_s_by_class: unknown classes"):
        AdmissionConfig(ttft_objective_s_by_class={"premium": 1})
    with pytest.raises(ValidationError):
        AdmissionConfig(ttft_objective_s_by_class={"interactive": 0})
