"""What crosses the Router -> LLMServer hop: one forwarded HTTP request, and its reply as a stream;
and the stats a replica reports to Serve for routing and autoscaling.

The Router forwards the client's request (path, rewritten JSON body, a few headers) to a replica,
which answers it with the OpenAI server of its engine (vLLM's own for a real model). The reply
comes back as `ReplyHead` (status, headers, the first bytes), then `bytes` (ready SSE frames,
several tokens per item), then one `ReplyEnd` (the last bytes and what the request used). No
item is a per-token object: the Router relays bytes.

A stream the Router may resume elsewhere (`track_tokens`) carries token ids: each item's bytes
end in the ids whose text they carry (`reply_part`), and the head has the prompt's
(`StreamStart`).
Should its replica or engine die, the Router sends the same request again with `resume` (the
ids so far): the new replica continues the answer from there, in the same stream's frames.

Plain data: no Ray, no vLLM, picklable.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from llmserve.protocol.route_note import RouteSlip

# Paths a replica answers; the Router forwards nothing else to it.
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"  # OpenAI's Responses API (POST creates; GET/cancel: the Router)
FORWARDED_PATHS = (
    CHAT_PATH,
    COMPLETIONS_PATH,
    RESPONSES_PATH,
    "/tokenize",
    "/detokenize",
    "/v1/embeddings",
)
GENERATION_PATHS = (CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH)
# The header that names the request's tenant to a replica (the Router sets it; a client's
# own is never forwarded): whose stored responses the request may read.
TENANT_HEADER = "x-llmserve-tenant"


@dataclass(frozen=True)
class ReplicaRequest:
    request_id: str
    path: str
    body: bytes  # JSON, as the Router rewrote it (max_tokens cap, priority)
    headers: tuple[tuple[str, str], ...] = ()  # content-type, x-request-id, traceparent, ...
    # On a retry: the replica that refused the first attempt, which the request router skips.
    avoid_replica_id: str | None = None
    # Send the token ids with the reply (reply_part): the Router may resume this stream.
    track_tokens: bool = False
    resume: Resume | None = None  # continue this answer from where a dead replica left it
    adapter: str | None = None  # the LoRA adapter the request names: routed to its holders
    # Where the request router notes why it chose the replica (llmserve/protocol/route_note.py).
    route: RouteSlip = field(default_factory=RouteSlip, compare=False, repr=False)


# Token ids on the hot path, as vLLM wrote them: decimal, comma-separated (b"12,345"), b"" for
# none. Joined and parsed only when a stream resumes (`parse_ids`).
RawIds = bytes


def parse_ids(pieces: Iterable[RawIds]) -> tuple[int, ...]:
    return tuple(int(x) for piece in pieces for x in piece.split(b",") if x.strip())


@dataclass(frozen=True)
class StreamStart:
    """What a resumed stream must say as its first replica said it."""

    chunk_id: str  # the chunks' "id"
    created: int
    prompt_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Resume:
    """A stream to continue: its start, and the answer's token ids its client already has."""

    start: StreamStart
    token_ids: tuple[int, ...]


@dataclass
class Usage:
    """What one request used, counted from the engine's outputs (not parsed from the reply)."""

    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    # Seconds from the replica receiving the request to its first / last engine output.
    first_output_s: float | None = None
    last_output_s: float | None = None

    @property
    def num_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_completion_tokens


@dataclass(frozen=True)
class ReplyHead:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    replica_id: str = ""
    # Set by a replica that refuses before doing any work ("replica_unhealthy"): the Router
    # retries such a refusal on another replica.
    code: str | None = None
    # A tracked stream's (ReplicaRequest.track_tokens): its start, and the ids `body` carries.
    stream_start: StreamStart | None = None
    token_ids: RawIds = b""

    @property
    def content_type(self) -> str:
        return next((v for k, v in self.headers if k == "content-type"), "")

    @property
    def is_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")


@dataclass(frozen=True)
class ReplyEnd:
    body: bytes
    usage: Usage = field(default_factory=Usage)
    # The replica's app or engine failed after the head was sent; `body` then already ends the
    # stream the way the engine's own server does (a tracked stream's: only the frames before
    # the failure, for the Router to resume it).
    failed: bool = False
    token_ids: RawIds = b""  # a tracked stream's: the ids whose text `body` carries


# A tracked stream's item: its bytes, then IDS_MARK and the ids whose text they carry. Still one
# bytes object, which crosses the hop at the cost of untracked bytes (a tuple or a dataclass per
# item cost the Router and the replica a fifth more CPU a token); SSE bytes never hold a NUL
# (JSON escapes it).
IDS_MARK = b"\0"


def reply_part(body: bytes, token_ids: RawIds) -> bytes:
    return body + IDS_MARK + token_ids


def split_part(item: bytes) -> tuple[bytes, RawIds]:
    body, _, token_ids = item.rpartition(IDS_MARK)
    return body, token_ids


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_unfinished: int  # requests the engine still tracks (running + waiting + finishing)
    kv_cache_usage: float  # 0..1, from the engine's last scheduler report
    healthy: bool
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CachedBlocks:
    """The blocks an engine's prefix cache holds: block keys of llmserve/policies/prefix_cache.py.
    A replica reports them in its routing stats packed (`pack()`, `PackedBlocks`)."""

    version: int  # grows with every change of the set
    block_size: int  # tokens per block
    hash_seed: str | None  # PYTHONHASHSEED of the engine, None for vLLM's fixed default
    keys: frozenset[int]

    def pack(self) -> PackedBlocks:
        keys = array("Q", sorted(self.keys)).tobytes()
        return PackedBlocks(self.version, self.block_size, self.hash_seed, keys)

    def to_stats(self) -> dict[str, Any]:
        return self.pack().to_stats()

    @classmethod
    def from_stats(cls, d: Mapping[str, Any]) -> CachedBlocks:
        return PackedBlocks.from_stats(d).unpack()


# -- the stats a replica reports -----------------------------------------------------------
# Serve's controller holds them, and hands them to the request routers and the autoscaling
# policy, without our code: they cross as plain dicts (`to_stats()`), whose keys are the field
# names below. `from_stats()` takes a partial dict (a replica that has not reported yet, or an
# older one): what is missing takes the field's default; keys it does not know are ignored.


def _plain(stats: Any) -> dict[str, Any]:
    return {f.name: getattr(stats, f.name) for f in fields(stats)}


def _known(cls: type, d: Mapping[str, Any] | None) -> dict[str, Any]:
    return {f.name: d[f.name] for f in fields(cls) if f.name in d} if d else {}


@dataclass(frozen=True)
class PackedBlocks:
    """`CachedBlocks` as the routing stats carry them: the keys packed, 8 bytes each, so that a
    router reads the version (and skips a set it already holds) without decoding them."""

    version: int
    block_size: int
    hash_seed: str | None
    keys: bytes  # array("Q") of the sorted keys

    def unpack(self) -> CachedBlocks:
        keys = array("Q")
        keys.frombytes(self.keys)
        return CachedBlocks(self.version, self.block_size, self.hash_seed, frozenset(keys))

    def to_stats(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_stats(cls, d: Mapping[str, Any]) -> PackedBlocks:
        return cls(**_known(cls, d))  # every field is required


@dataclass(frozen=True)
class RoutingStats:
    """What an LLMServer replica reports through `record_routing_stats` (every
    `routing.stats_period_s`) and the request router reads as `replica.routing_stats`."""

    num_running: int | None = None
    num_waiting: int | None = None
    kv_cache_usage: float | None = None  # 0..1
    healthy: bool = True  # a replica is healthy until it says otherwise
    timestamp_s: float | None = None  # the replica's time.time() when it reported
    cached_blocks: PackedBlocks | None = None  # None: the engine does not report its cache
    adapters: tuple[str, ...] | None = None  # LoRA adapters its engine holds; None: no LoRA
    # Adapters it registered from its user_config (llmserve/replica/runtime_adapters.py), which
    # other replicas of the model may not have yet while a change rolls out; None: none.
    runtime_adapters: tuple[str, ...] | None = None

    def age_s(self, now_s: float) -> float | None:
        """Seconds since the report (0 for a clock ahead of ours); None without a stamp."""
        return None if self.timestamp_s is None else max(0.0, now_s - self.timestamp_s)

    def to_stats(self) -> dict[str, Any]:
        d = _plain(self)
        blocks = d.pop("cached_blocks")
        if blocks is not None:  # absent rather than None, as an engine without a cache sends
            d["cached_blocks"] = blocks.to_stats()
        for key in ("adapters", "runtime_adapters"):
            names = d.pop(key)
            if names is not None:  # absent, as an engine without LoRA (or an older one) sends
                d[key] = list(names)
        return d

    @classmethod
    def from_stats(cls, d: Mapping[str, Any] | None) -> RoutingStats:
        known = _known(cls, d)
        if known.get("cached_blocks") is not None:
            known["cached_blocks"] = PackedBlocks.from_stats(known["cached_blocks"])
        for key in ("adapters", "runtime_adapters"):
            if known.get(key) is not None:
                known[key] = tuple(known[key])
        return cls(**known)


R = TypeVar("R", bound=Hashable)


@dataclass(frozen=True)
class AutoscalingStats:
    """What an LLMServer replica reports through `record_autoscaling_stats` for
    llmserve/autoscaling/ray_policy.py. Ray wants numbers only; a missing one counts as 0."""

    engine_running: float = 0.0
    engine_waiting: float = 0.0
    router_queued: float = 0.0  # the Router's queue for the model (every replica reports it)

    def to_stats(self) -> dict[str, float]:
        return _plain(self)

    @classmethod
    def from_stats(cls, d: Mapping[str, float] | None) -> AutoscalingStats:
        return cls(**_known(cls, d))

    @classmethod
    def per_replica(
        cls, aggregated: Mapping[str, Mapping[R, float]] | None
    ) -> dict[R, AutoscalingStats]:
        """Ray's `AutoscalingContext.aggregated_metrics`, which holds each key of the replicas'
        reports as {replica id: value aggregated over the look-back window}, turned back into
        one report per replica."""
        by_replica: dict[R, dict[str, float]] = {}
        for key, values in (aggregated or {}).items():
            for replica_id, value in values.items():
                by_replica.setdefault(replica_id, {})[key] = value
        return {replica_id: cls.from_stats(d) for replica_id, d in by_replica.items()}
