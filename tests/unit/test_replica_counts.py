"""The running-replica counts the request routers write for the Router's admission
(`ReplicaCounts`, handed over on each request's RouteSlip, llmserve/protocol/route_note.py):
what a model's count is once its request router has seen a request of this Router, every change
Ray pushes after that, and which models must still be asked of the Serve controller."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
from ray.serve.request_router import RequestRouter

from llmserve.protocol.replica_call import ReplicaRequest
from llmserve.protocol.route_note import ReplicaCounts, RouteNote, RouteSlip
from tests.unit.router_helpers import llm_router, replica, round_robin


def pending(counts: ReplicaCounts | None) -> SimpleNamespace:
    """A pending request of the Router that owns `counts`, as Ray hands it to choose_replicas."""
    slip = RouteSlip(replica_counts=counts)
    request = ReplicaRequest("r", "/v1/completions", b"{}", (), route=slip)
    meta = SimpleNamespace(session_id="", request_id="r", internal_request_id="r")
    return SimpleNamespace(args=[request], metadata=meta)


def test_a_model_is_asked_of_the_controller_until_its_count_is_noted():
    counts = ReplicaCounts()
    deployments = {"small": "llm-small", "big": "llm-big"}
    assert counts.split(deployments) == ({}, ["small", "big"])
    counts.note("llm-small", 2)
    assert counts.split(deployments) == ({"small": 2}, ["big"])
    counts.note("llm-big", 0)  # scaled to zero is a count, not an unknown
    assert counts.split(deployments) == ({"small": 2, "big": 0}, [])


@pytest.fixture
def pushes(monkeypatch) -> list[int]:
    """Ray's own bookkeeping of the set needs a live handle: it is replaced by a record."""
    seen: list[int] = []

    def update(self, rs):
        seen.append(len(rs))
        self._replicas = {r.replica_id: r for r in rs}

    monkeypatch.setattr(RequestRouter, "update_replicas", update)
    return seen


@pytest.mark.parametrize("make", [llm_router, round_robin], ids=["llm_aware", "round_robin"])
async def test_each_request_router_writes_every_change_into_the_routers_it_served(make, pushes):
    router = make()  # of the deployment llm-small
    router.update_replicas([replica("a"), replica("b")])
    counts, other = ReplicaCounts(), ReplicaCounts()
    # Before a request of this Router the request router does not know it: nothing written.
    assert counts.split({"small": "llm-small"}) == ({}, ["small"])
    await router.choose_replicas([replica("a"), replica("b")], pending(counts))
    assert counts.split({"small": "llm-small"}) == ({"small": 2}, [])  # at its first request
    for running in (["a", "b", "c"], ["b"], []):  # and every change after, zero included
        router.update_replicas([replica(uid) for uid in running])
        assert counts.split({"small": "llm-small"}) == ({"small": len(running)}, [])
    assert other.split({"small": "llm-small"}) == ({}, ["small"])  # a Router it never served
    assert pushes == [2, 3, 1, 0]


async def test_a_request_without_counts_is_routed_as_before(pushes):
    router = llm_router()
    router.update_replicas([replica("a")])
    ranks = await router.choose_replicas([replica("a")], pending(None))
    assert [[r.replica_id.unique_id for r in rank] for rank in ranks] == [["a"]]


def test_the_counts_stay_in_the_routers_process():
    """The slip crosses to the replica with its request: its note does, the Router's counts
    (a live object of the Router's process) do not."""
    counts = ReplicaCounts()
    counts.note("llm-small", 2)
    slip = RouteSlip(RouteNote("least_loaded", "a", 0.5, 0), counts)
    copy = pickle.loads(pickle.dumps(slip))
    assert copy.note == slip.note and copy.replica_counts is None
    assert b"llm-small" not in pickle.dumps(slip)
