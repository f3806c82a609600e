"""The running-replica counts the request routers note for the Router's admission
(llmserve/request_router/replica_counts.py): what a model's count is once Ray pushed its replica
set, and which models must still be asked of the Serve controller."""

from __future__ import annotations

import pytest
from ray.serve.request_router import RequestRouter

from llmserve.request_router import replica_counts
from tests.unit.router_helpers import llm_router, replica, round_robin


@pytest.fixture(autouse=True)
def _empty(monkeypatch):
    monkeypatch.setattr(replica_counts, "_counts", {})


def test_a_model_is_asked_of_the_controller_until_its_count_is_noted():
    deployments = {"small": "llm-small", "big": "llm-big"}
    assert replica_counts.split("app", deployments) == ({}, ["small", "big"])
    replica_counts.note("app", "llm-small", 2)
    assert replica_counts.split("app", deployments) == ({"small": 2}, ["big"])
    replica_counts.note("app", "llm-big", 0)  # scaled to zero is a count, not an unknown
    assert replica_counts.split("app", deployments) == ({"small": 2, "big": 0}, [])


def test_apps_with_the_same_deployment_name_are_kept_apart():
    replica_counts.note("one", "llm-small", 3)
    assert replica_counts.split("two", {"small": "llm-small"}) == ({}, ["small"])
    assert replica_counts.split("one", {"small": "llm-small"}) == ({"small": 3}, [])


@pytest.mark.parametrize("make", [llm_router, round_robin], ids=["llm_aware", "round_robin"])
def test_each_request_router_notes_every_change_of_the_running_set(make, monkeypatch):
    seen = []
    # Ray's own bookkeeping of the set needs a live handle; what it is given is what counts.
    monkeypatch.setattr(RequestRouter, "update_replicas", lambda self, rs: seen.append(len(rs)))
    router = make()  # of the deployment llm-small in the app "app"
    for running in (["a"], ["a", "b", "c"], ["b"], []):
        router.update_replicas([replica(uid) for uid in running])
        assert replica_counts.split("app", {"small": "llm-small"}) == ({"small": len(running)}, [])
    assert seen == [1, 3, 1, 0]
