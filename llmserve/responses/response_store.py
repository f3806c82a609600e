"""The Responses API's stored responses, where every replica and Router reads them.

vLLM keeps a stored response (and the messages that led to it) in its server's memory, so a
follow-up by `previous_response_id` works only on the replica that answered the first turn, and
a replica's death or a scale-down loses every conversation it held. Here each replica hands
what its engine stored to this one deployment as soon as the turn ends (before the client has
the turn's last bytes), and stages what a follow-up names into its engine's memory before the
engine reads it: any replica continues any conversation, and a replica's end loses none.

Entries belong to the tenant whose request made them: another tenant's key reads nothing (the
same 404 as an unknown id). The store holds the newest `max_entries` and forgets the oldest; it
lives in one replica's memory, so its own restart forgets them all (docs/api.md says so).
"""

from __future__ import annotations

from ray import serve

from llmserve.responses.stored_responses import StoredResponse, StoredResponses


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class ResponseStore:
    def __init__(self, max_entries: int) -> None:
        self._stored = StoredResponses(max_entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._stored.put(response_id, entry)

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        return self._stored.get(response_id, tenant)
