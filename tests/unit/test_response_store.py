"""The Responses API's store: the bounded map of stored responses (tenants apart, the oldest
forgotten first) and a replica's turns over it (llmserve/replica/stored_turns.py) with a fake
engine and a fake store handle."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmserve.protocol.replica_call import RESPONSES_PATH, TENANT_HEADER, ReplicaRequest, ReplyHead
from llmserve.replica.stored_turns import StoredTurns, Turn
from llmserve.responses.stored_responses import StoredResponse, StoredResponses


def entry(tenant: str, text: str = "r") -> StoredResponse:
    return StoredResponse(tenant, f'{{"id": "{text}"}}'.encode(), text.encode())


def test_a_tenant_reads_its_own_responses_only():
    stored = StoredResponses(max_entries=10)
    stored.put("resp_a", entry("ada"))
    assert stored.get("resp_a", "ada") == entry("ada")
    assert stored.get("resp_a", "bob") is None  # the same as an unknown id
    assert stored.get("resp_x", "ada") is None
    stored.put("resp_a", entry("bob", "overwrite"))  # an id stays its first owner's
    assert stored.get("resp_a", "ada") == entry("ada")
    assert stored.get("resp_a", "bob") is None


def test_the_oldest_unused_response_goes_first():
    stored = StoredResponses(max_entries=2)
    stored.put("r1", entry("t"))
    stored.put("r2", entry("t"))
    assert stored.get("r1", "t") is not None  # in use: newest again
    stored.put("r3", entry("t"))
    assert [stored.get(r, "t") is not None for r in ("r1", "r2", "r3")] == [True, False, True]
    assert len(stored) == 2


class FakeEngine:
    def __init__(self) -> None:
        self.storing = False
        self.stored: dict[str, tuple[bytes, bytes]] = {}  # what the server stored, by id
        self.staged: dict[str, bytes] = {}

    def store_responses(self) -> None:
        self.storing = True

    def take_stored_response(self, response_id):
        return self.stored.pop(response_id, None)

    def stage_stored_response(self, response_id, state):
        if state is None:
            self.staged.pop(response_id, None)
        else:
            self.staged[response_id] = state


class Remote:
    def __init__(self, fn) -> None:
        self._fn = fn

    def remote(self, *args):
        async def call():
            return self._fn(*args)

        return call()


class FakeStore:
    def __init__(self) -> None:
        self.stored = StoredResponses(max_entries=100)
        self.get = Remote(self.stored.get)
        self.put = Remote(self.stored.put)


def request(tenant: str, **body) -> ReplicaRequest:
    return ReplicaRequest(
        "req-1",
        RESPONSES_PATH,
        json.dumps({"model": "m", "input": "hi", **body}).encode(),
        (("content-type", "application/json"), (TENANT_HEADER, tenant)),
    )


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def turns():
    engine, store = FakeEngine(), FakeStore()
    return StoredTurns(engine, store), engine, store


def answered(turn: Turn, engine: FakeEngine) -> str:
    """The engine answers the turn and stores it, as vLLM's server does."""
    response_id = json.loads(turn.request.body)["request_id"]
    engine.stored[response_id] = (f'{{"id": "{response_id}"}}'.encode(), b"state")
    return response_id


def test_a_turn_is_named_by_the_replica_and_kept_under_its_tenant(turns):
    st, engine, store = turns
    assert engine.storing
    turn = run(st.open(request("ada", request_id="resp_someone_elses")))
    response_id = answered(turn, engine)
    assert response_id.startswith("resp_") and response_id != "resp_someone_elses"
    run(turn.keep())
    run(turn.keep())  # once
    turn.close()
    assert store.stored.get(response_id, "ada").engine_state == b"state"
    assert engine.stored == {} and engine.staged == {}  # nothing left in the engine's memory


def test_a_follow_up_stages_its_previous_turn_while_it_runs(turns):
    st, engine, store = turns
    store.stored.put("resp_1", StoredResponse("ada", b"{}", b"turn-1"))
    a = run(st.open(request("ada", previous_response_id="resp_1")))
    b = run(st.open(request("ada", previous_response_id="resp_1")))
    assert engine.staged == {"resp_1": b"turn-1"}
    a.close()
    assert engine.staged == {"resp_1": b"turn-1"}  # b still reads it
    b.close()
    assert engine.staged == {}


def test_another_tenants_previous_turn_is_a_404_before_the_engine(turns):
    st, engine, store = turns
    store.stored.put("resp_1", StoredResponse("ada", b"{}", b"turn-1"))
    for tenant, previous in (("bob", "resp_1"), ("ada", "resp_unknown")):
        refused = run(st.open(request(tenant, previous_response_id=previous)))
        assert isinstance(refused, ReplyHead) and refused.status == 404
        assert json.loads(refused.body)["error"]["message"] == (
            f"Response with id '{previous}' not found."
        )
    assert engine.staged == {}


def test_unstored_and_unanswered_turns_leave_nothing(turns):
    st, engine, store = turns
    unstored = run(st.open(request("ada", store=False)))  # the engine stores nothing
    run(unstored.keep())
    unstored.close()
    left = run(st.open(request("ada")))
    answered(left, engine)
    left.close()  # the client left before the end: the turn is not kept
    assert len(store.stored) == 0 and engine.stored == {}


def test_a_body_that_is_not_an_object_goes_to_the_engine_as_it_came(turns):
    st, _, _ = turns
    bad = ReplicaRequest("req-1", RESPONSES_PATH, b"[1, 2]", ())
    turn = run(st.open(bad))
    assert turn.request is bad
    run(turn.keep())
    turn.close()
