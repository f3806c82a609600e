"""Ray Serve request routers for the LLMServer deployments (Ray's RequestRouterConfig hook).

`LLMAwareRequestRouter` gathers each replica's load (its published routing stats plus this
router's own in-flight count), with prefix-aware routing how much of the request's prompt each
replica's KV cache holds (the engine's block set from its routing stats, the prompt's block
hashes from the model's tokenizer), and for a request naming a LoRA adapter which replicas'
engines hold it (their routing stats), and asks the pure policy in llmserve/policies/routing.py
for a replica. Each decision is counted by reason and noted on the request for the Router
(its RouteSlip, llmserve/protocol/route_note.py): the trace span and the debug header say why.
`RoundRobinRequestRouter` exists as the baseline the balance test compares against.
Both write each change of the running replica set into the ReplicaCounts of the Routers whose
requests they routed (the slip's, llmserve/protocol/route_note.py), for admission.
Ray's base class does the rest: FIFO order, retries with backoff, dropping dead replicas.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import weakref
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from llmserve.policies.prefix_cache import PrefixIndex, block_keys
from llmserve.policies.replica_ledger import InFlight, Sessions
from llmserve.policies.routing import Choice, ReplicaLoad, ScoreWeights, choose, score
from llmserve.protocol.replica_call import PackedBlocks, ReplicaRequest, RoutingStats
from llmserve.protocol.route_note import ReplicaCounts, RouteNote

logger = logging.getLogger("ray.serve")
MAX_MEMO = 1024
INLINE_TOKENIZE_BYTES = 16_384  # longer bodies are tokenized off the event loop
TOKENIZER_RETRY_S = 10.0


def replica_load(replica: RunningReplica, num_in_flight: int, now_s: float) -> ReplicaLoad:
    stats = RoutingStats.from_stats(replica.routing_stats)
    return ReplicaLoad(
        replica_id=replica.replica_id.unique_id,
        num_in_flight=num_in_flight,
        num_waiting=stats.num_waiting,
        num_running=stats.num_running,
        kv_cache_usage=stats.kv_cache_usage,
        stats_age_s=stats.age_s(now_s),
        healthy=stats.healthy,
    )


def _replica_request(pending_request: PendingRequest | None) -> ReplicaRequest | None:
    args = getattr(pending_request, "args", None) or ()
    return args[0] if args and hasattr(args[0], "route") else None


def _avoided_replica(pending_request: PendingRequest | None) -> str | None:
    request = _replica_request(pending_request)
    return request.avoid_replica_id if request is not None else None


def route_note(
    choice: Choice, block_tokens: int, adapter_holders: frozenset[str] | None = None
) -> RouteNote:
    cached = dict(choice.cached_blocks)
    winner = choice.replica_id
    others = [(r, s) for r, s in choice.candidates if r != winner]
    runner_up, runner_up_load = others[0] if others else ("", 0.0)
    return RouteNote(
        choice.reason,
        winner,
        dict(choice.candidates).get(winner, 0.0),
        cached.get(winner, 0) * block_tokens,
        runner_up,
        runner_up_load,
        cached.get(runner_up, 0) * block_tokens,
        None if adapter_holders is None else winner in adapter_holders,
    )


class _CountsReplicas(RequestRouter):
    """Tells each Router whose request it routed how many replicas run, and every change."""

    def initialize_state(self, **kwargs) -> None:
        self._told: weakref.WeakSet[ReplicaCounts] = weakref.WeakSet()  # a Router's, while it lives

    def _tell(self, pending_request: PendingRequest | None) -> None:
        request = _replica_request(pending_request)
        counts = request.route.replica_counts if request is not None else None
        if counts is not None and counts not in self._told:
            self._told.add(counts)
            counts.note(self._deployment_id.name, len(self.curr_replicas))

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        for counts in self._told:
            counts.note(self._deployment_id.name, len(replicas))


class LLMAwareRequestRouter(FIFOMixin, _CountsReplicas):
    def initialize_state(self, **kwargs) -> None:
        super().initialize_state(**kwargs)
        self._weights = ScoreWeights.from_dict(kwargs.get("weights", {}))
        self._session_affinity = kwargs.get("session_affinity", True)
        self._rng = random.Random(kwargs.get("seed"))
        self._in_flight = InFlight()  # by ReplicaID
        self._sessions = Sessions()  # session id -> replica unique id
        self._model = kwargs.get("model", "")
        self._prefix = kwargs.get("prefix")  # {"model_dir", "chat_template"} or None: off
        self._index = PrefixIndex()
        self._tokens: Any = (
            None  # llmserve.request_router.prompt_tokens.PromptTokens, loaded on first use
        )
        self._tokens_failed_s = -TOKENIZER_RETRY_S
        self._memo: OrderedDict[str, list[int] | None] = OrderedDict()  # request -> block keys
        self._decisions: Any = None  # the counter; False where Ray's metrics are unavailable
        self._block_tokens = 0

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        self._tell(pending_request)
        avoid = _avoided_replica(pending_request)
        if avoid is not None:  # a retry: not the replica that refused it, while there is another
            candidate_replicas = [
                r for r in candidate_replicas if r.replica_id.unique_id != avoid
            ] or candidate_replicas
        candidate_replicas, holders = _for_adapter(candidate_replicas, pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        now_s = time.time()
        loads = [replica_load(r, self._in_flight[r.replica_id], now_s) for r in candidate_replicas]
        session = self._session_of(pending_request)
        # vLLM keys an adapter's blocks by the adapter too: the prompt's base-model hashes
        # would credit blocks it cannot use.
        keys = (
            None
            if holders is not None
            else await self._prompt_keys(candidate_replicas, pending_request)
        )
        cached = None
        if keys:
            cached = {
                uid: self._index.cached_blocks(uid, keys, now_s)
                for uid in by_id  # the index holds only what _prompt_keys refreshed
            }
        choice = choose(
            loads,
            self._rng,
            self._weights,
            self._sessions.get(session),
            cached,
            len(keys or ()),
            holders,
        )
        if choice is None:
            return []
        if keys:
            self._index.routed(choice.replica_id, keys, now_s)
        self._note(choice, pending_request, holders)
        if logger.isEnabledFor(logging.DEBUG):
            request_id = pending_request.metadata.request_id if pending_request else "-"
            logger.debug(
                "route %s -> %s (%s) candidates %s",
                request_id,
                choice.replica_id,
                choice.reason,
                choice.candidates,
            )
        self._sessions.went_to(session, choice.replica_id)
        # The other healthy ones, best first, as fallbacks if the chosen one refuses (queue full).
        scores = {x.replica_id: score(x, self._weights) for x in loads if x.healthy}
        scores.pop(choice.replica_id, None)
        rest = sorted(
            (r for r in candidate_replicas if r.replica_id.unique_id in scores),
            key=lambda r: scores[r.replica_id.unique_id],
        )
        return [[by_id[choice.replica_id]], rest] if rest else [[by_id[choice.replica_id]]]

    async def _prompt_keys(
        self, candidates: list[RunningReplica], pending_request: PendingRequest | None
    ) -> list[int] | None:
        """The request's prompt blocks as the engines name them, once per request; and each
        candidate's reported block set brought up to date in the index. None: route by load."""
        if self._prefix is None or pending_request is None:
            return None
        reports: list[PackedBlocks] = []
        for r in candidates:
            blocks = RoutingStats.from_stats(r.routing_stats).cached_blocks
            if blocks is not None:
                uid = r.replica_id.unique_id
                if not self._index.is_current(uid, blocks.version):
                    self._index.update(uid, blocks.version, blocks.unpack().keys)
                reports.append(blocks)
        if not reports:
            return None  # no engine reports its cache (yet): nothing to match
        request_id = pending_request.metadata.internal_request_id
        if request_id in self._memo:
            return self._memo[request_id]
        args = getattr(pending_request, "args", None) or ()
        body = getattr(args[0], "body", None) if args else None
        keys = None
        tokens = self._prompt_tokens()
        if tokens is not None and isinstance(body, bytes):
            block_size, seed = reports[0].block_size, reports[0].hash_seed
            self._block_tokens = block_size
            path = args[0].path
            if len(body) <= INLINE_TOKENIZE_BYTES:
                keys = _block_keys(tokens, path, body, block_size, seed)
            else:
                keys = await asyncio.to_thread(_block_keys, tokens, path, body, block_size, seed)
        self._memo[request_id] = keys
        while len(self._memo) > MAX_MEMO:
            self._memo.popitem(last=False)
        return keys

    def _prompt_tokens(self) -> Any:
        if self._tokens is None and time.monotonic() - self._tokens_failed_s > TOKENIZER_RETRY_S:
            from llmserve.request_router.prompt_tokens import (
                PromptTokens,  # tokenizers and jinja2: lazily
            )

            try:
                self._tokens = PromptTokens(
                    self._prefix["model_dir"], self._prefix.get("chat_template")
                )
            except Exception as e:  # not prepared on this node yet, or no tokenizer.json
                self._tokens_failed_s = time.monotonic()
                logger.warning("prefix-aware routing waits for a tokenizer: %s", e)
        return self._tokens

    def _note(
        self,
        choice: Choice,
        pending_request: PendingRequest | None,
        holders: frozenset[str] | None,
    ) -> None:
        request = _replica_request(pending_request)
        if request is not None:
            request.route.note = route_note(choice, self._block_tokens, holders)

    def _session_of(self, pending_request: PendingRequest | None) -> str:
        if not self._session_affinity or pending_request is None:
            return ""
        return pending_request.metadata.session_id or ""

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        for uid in self._index.replica_ids() - live:
            self._index.drop(uid)  # removed or replaced: its cache is gone with it

    def on_request_routed(self, pending_request, replica_id: ReplicaID, result) -> None:
        # Counted here, not in choose_replicas: Ray may ask for a choice several times while
        # every replica is full, but routes each request once.
        request = _replica_request(pending_request)
        note = request.route.note if request is not None else None
        if note is not None:
            if self._decisions is None:
                self._decisions = _decision_counter()
            if self._decisions:
                self._decisions.inc(tags={"model": self._model, "reason": note.reason})
        request_id = pending_request.metadata.internal_request_id if pending_request else ""
        self._in_flight.routed(replica_id, request_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._in_flight.completed(replica_id, internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.drop(replica_id.unique_id)
        self._in_flight.forget(replica_id)


def _for_adapter(
    candidates: list[RunningReplica], pending_request: PendingRequest | None
) -> tuple[list[RunningReplica], frozenset[str] | None]:
    """For a request naming a LoRA adapter: the candidates that registered it from their
    user_config if any did (while a change rolls out, the others would answer 404; an args
    adapter is registered everywhere), and among them those whose engines hold it (their last
    stats). For a request for the base model: all candidates, and None."""
    args = getattr(pending_request, "args", None) or ()
    adapter = getattr(args[0], "adapter", None) if args else None
    if adapter is None:
        return candidates, None
    stats = [(r, RoutingStats.from_stats(r.routing_stats)) for r in candidates]
    registered = [(r, st) for r, st in stats if adapter in (st.runtime_adapters or ())]
    chosen = registered or stats
    holders = frozenset(
        r.replica_id.unique_id for r, st in chosen if adapter in (st.adapters or ())
    )
    return [r for r, _ in chosen], holders


def _block_keys(tokens: Any, path: str, body: bytes, block_size: int, seed: str | None):
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    ids = tokens.token_ids(path, parsed) if isinstance(parsed, dict) else None
    return block_keys(ids, block_size, seed) if ids else None


def _decision_counter() -> Any:
    try:
        from llmserve.observability.metrics import routing_decisions

        return routing_decisions()
    except Exception:  # outside a Ray worker (unit tests)
        return False


class RoundRobinRequestRouter(FIFOMixin, _CountsReplicas):
    """Baseline: each replica in turn, whatever its load."""

    def initialize_state(self, **kwargs) -> None:
        super().initialize_state(**kwargs)
        self._turn = itertools.count()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        self._tell(pending_request)
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        return [[ordered[next(self._turn) % len(ordered)]]]
