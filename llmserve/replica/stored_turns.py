"""A replica's side of the Responses API's store (llmserve/responses/response_store.py).

Each `POST /v1/responses` is one turn: the replica names the response itself (an id no client
chose, so none can overwrite another's), stages the stored response a follow-up names into its
engine's memory (where vLLM's server reads `previous_response_id`), and once the engine has
answered, moves what it stored to the app's ResponseStore, under the request's tenant, before
the client has the turn's last bytes: the next turn may land on any replica.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections import Counter
from typing import Protocol

from ray.serve.handle import DeploymentHandle

from llmserve.protocol.openai_protocol import response_not_found
from llmserve.protocol.replica_call import TENANT_HEADER, ReplicaRequest, ReplyHead
from llmserve.replica.engine.asgi_call import JSON_HEADERS
from llmserve.responses.stored_responses import StoredResponse


class StoringEngine(Protocol):
    def store_responses(self) -> None: ...

    def take_stored_response(self, response_id: str) -> tuple[bytes, bytes] | None: ...

    def stage_stored_response(self, response_id: str, state: bytes | None) -> None: ...


def not_found(response_id: str) -> ReplyHead:
    error = response_not_found(response_id)
    return ReplyHead(error.status, JSON_HEADERS, json.dumps(error.body()).encode())


class StoredTurns:
    def __init__(self, engine: StoringEngine, store: DeploymentHandle) -> None:
        self._engine = engine
        self._store = store
        self._staged: Counter[str] = Counter()  # staged ids, by the turns in flight reading them
        engine.store_responses()

    async def open(self, request: ReplicaRequest) -> Turn | ReplyHead:
        """The turn, its request naming its response; or the 404 for a follow-up naming a
        response its tenant cannot read (unknown, forgotten, or another tenant's)."""
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None
        if not isinstance(body, dict):  # for vLLM's server to refuse, as it would
            return Turn(self, request, None, None, "")
        tenant = dict(request.headers).get(TENANT_HEADER, "")
        previous = body.get("previous_response_id")
        staged = None
        if isinstance(previous, str):
            entry: StoredResponse | None = await self._store.get.remote(previous, tenant)
            if entry is None:
                return not_found(previous)
            self._engine.stage_stored_response(previous, entry.engine_state)
            self._staged[previous] += 1
            staged = previous
        response_id = f"resp_{uuid.uuid4().hex}"
        body["request_id"] = response_id
        forwarded = dataclasses.replace(
            request, body=json.dumps(body, separators=(",", ":")).encode()
        )
        return Turn(self, forwarded, response_id, staged, tenant)

    async def keep(self, response_id: str, tenant: str) -> None:
        taken = self._engine.take_stored_response(response_id)
        if taken is not None:  # store: false stores nothing
            as_json, state = taken
            await self._store.put.remote(response_id, StoredResponse(tenant, as_json, state))

    def drop(self, response_id: str) -> None:
        self._engine.take_stored_response(response_id)

    def unstage(self, response_id: str) -> None:
        self._staged[response_id] -= 1
        if self._staged[response_id] <= 0:
            del self._staged[response_id]
            self._engine.stage_stored_response(response_id, None)


class Turn:
    """One request's turn: `keep()` once the engine has answered, `close()` at the end."""

    def __init__(
        self,
        turns: StoredTurns,
        request: ReplicaRequest,
        response_id: str | None,
        staged: str | None,
        tenant: str,
    ) -> None:
        self.request = request
        self._turns = turns
        self._response_id = response_id
        self._staged = staged
        self._tenant = tenant

    async def keep(self) -> None:
        """Moves what the engine stored of this turn to the store (once; no-op after)."""
        if self._response_id is not None:
            response_id, self._response_id = self._response_id, None
            await self._turns.keep(response_id, self._tenant)

    def close(self) -> None:
        """The turn is over, answered or not: nothing of it stays in the engine's memory."""
        if self._response_id is not None:  # ended before its answer: nothing kept
            self._turns.drop(self._response_id)
            self._response_id = None
        if self._staged is not None:
            self._turns.unstage(self._staged)
            self._staged = None
