"""The stored responses of the Responses API as plain data: what a turn leaves behind, and the
bounded map that holds them (llmserve/responses/response_store.py serves it).

Kept apart from the deployment's module on purpose: a `StoredResponse` crosses processes
(pickled by reference), and unpickling one imports its module. Importing a module with
`@serve.deployment` at its top builds a DeploymentConfig, which registers and then unregisters
Ray's request-router module for pickling by value; done while another thread of the same process
does the same, the second unregister raises (a 500 seen on a Router's first follow-up turn).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredResponse:
    tenant: str
    response_json: bytes  # the response as vLLM's server answers `GET /v1/responses/{id}`
    engine_state: bytes  # what the engine reloads for a follow-up (opaque here)


class StoredResponses:
    """Newest first out of reach last: a bounded map of response id -> StoredResponse."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        old = self._entries.get(response_id)
        if old is not None and old.tenant != entry.tenant:
            return  # an id is its first owner's, whoever names it again
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.tenant != tenant:
            return None
        self._entries.move_to_end(response_id)  # a conversation in use stays
        return entry

    def __len__(self) -> int:
        return len(self._entries)
