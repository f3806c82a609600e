"""The request router's own bookkeeping, pure: requests in flight per replica, and the replica
each session last went to. llmserve/request_router/request_router.py feeds them Ray's callbacks; the
rules (what may decrement a count, which session is forgotten first) are here, table-tested in
tests/unit/test_replica_ledger.py. Replica ids are any hashable (Ray's ReplicaID there).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterator

MAX_SESSIONS = 10_000
# Completions seen before their request was reported routed, remembered at most this many.
MAX_EARLY_COMPLETIONS = 10_000


class InFlight:
    """Requests this router sent to each replica and that have not completed: exact and
    immediate, unlike the replicas' own stats (a second old), so a burst does not herd."""

    def __init__(self, max_early_completions: int = MAX_EARLY_COMPLETIONS) -> None:
        self._by_replica: Counter[Hashable] = Counter()
        # (replica, request) of each accepted request not yet completed. Ray also reports the
        # completion of requests the replica rejected (or that failed before acceptance),
        # which were never counted: only these may decrement a count.
        self._routed: Counter[tuple[Hashable, str]] = Counter()
        # Completions of requests not (yet) counted. Ray registers a request's completion
        # callback before it awaits the replica's acceptance, so a quick unary handle call (a
        # driver's stats call) can complete before Ray reports it routed: counted then, it
        # would never come off, and its replica would look busier with every such call.
        # Rejections land here too; the oldest go beyond the bound. A rejected request that
        # Ray retries on the same replica then goes uncounted while it runs: an undercount by
        # one, rare, never a leak.
        self._early: OrderedDict[tuple[Hashable, str], None] = OrderedDict()
        self._max_early = max_early_completions

    def __getitem__(self, replica: Hashable) -> int:
        return self._by_replica[replica]

    def routed(self, replica: Hashable, request_id: str) -> None:
        key = (replica, request_id)
        if key in self._early:  # it already completed
            del self._early[key]
            return
        self._routed[key] += 1
        self._by_replica[replica] += 1

    def completed(self, replica: Hashable, request_id: str) -> None:
        key = (replica, request_id)
        if self._routed[key] <= 0:  # not counted (yet): rejected, or quicker than its routing
            self._early[key] = None
            self._early.move_to_end(key)
            while len(self._early) > self._max_early:
                self._early.popitem(last=False)
            return
        self._routed[key] -= 1
        if self._routed[key] <= 0:
            del self._routed[key]
        if self._by_replica[replica] > 0:
            self._by_replica[replica] -= 1

    def forget(self, replica: Hashable) -> None:
        """The replica died: nothing of it completes any more."""
        self._by_replica.pop(replica, None)
        for key in [k for k in self._routed if k[0] == replica]:
            del self._routed[key]
        for key in [k for k in self._early if k[0] == replica]:
            del self._early[key]

    def __len__(self) -> int:
        """Requests tracked (for leak checks)."""
        return sum(self._routed.values())


class Sessions:
    """Session id -> the replica its last request went to, the least recently used forgotten
    first beyond `max_sessions` (a client inventing ids cannot grow it without bound)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._max = max_sessions
        self._replica: OrderedDict[str, str] = OrderedDict()

    def get(self, session: str | None) -> str | None:
        return self._replica.get(session) if session else None

    def went_to(self, session: str | None, replica_id: str) -> None:
        if not session:
            return
        self._replica[session] = replica_id
        self._replica.move_to_end(session)
        while len(self._replica) > self._max:
            self._replica.popitem(last=False)

    def __len__(self) -> int:
        return len(self._replica)

    def __iter__(self) -> Iterator[str]:
        """Session ids, the least recently used first."""
        return iter(self._replica)
