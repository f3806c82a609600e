"""What crosses the Router -> LLMServer hop: one forwarded HTTP request, and its reply as a stream.

The Router forwards the client's request (path, rewritten JSON body, a few headers) to a replica,
which answers it with the OpenAI server of its engine (vLLM's own for a real model). The reply
comes back as `ReplyHead` (status, headers, the first bytes), then `bytes` (ready SSE frames,
several tokens per item), then one `ReplyEnd` (the last bytes and what the request used). No
item is a per-token object: the Router relays bytes.

Plain data: no Ray, no vLLM, picklable.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

# Paths a replica answers; the Router forwards nothing else to it.
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
FORWARDED_PATHS = (CHAT_PATH, COMPLETIONS_PATH, "/tokenize", "/detokenize", "/v1/embeddings")
GENERATION_PATHS = (CHAT_PATH, COMPLETIONS_PATH)


@dataclass(frozen=True)
class ReplicaRequest:
    request_id: str
    path: str
    body: bytes  # JSON, as the Router rewrote it (max_tokens cap, priority)
    headers: tuple[tuple[str, str], ...] = ()  # content-type, x-request-id, traceparent, ...
    # On a retry: the replica that refused the first attempt, which the request router skips.
    avoid_replica_id: str | None = None


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
    # stream the way the engine's own server does.
    failed: bool = False


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
    """The blocks an engine's prefix cache holds, as a replica reports them in its routing
    stats (key `cached_blocks`, as `to_stats()`: plain types, since Serve's controller holds
    them without our code): block keys of serve_app/policies/prefix_cache.py, 8 bytes each."""

    version: int  # grows with every change of the set
    block_size: int  # tokens per block
    hash_seed: str | None  # PYTHONHASHSEED of the engine, None for vLLM's fixed default
    keys: frozenset[int]

    def to_stats(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "block_size": self.block_size,
            "hash_seed": self.hash_seed,
            "keys": array("Q", sorted(self.keys)).tobytes(),
        }

    @classmethod
    def from_stats(cls, d: dict[str, Any]) -> CachedBlocks:
        keys = array("Q")
        keys.frombytes(d["keys"])
        return cls(d["version"], d["block_size"], d["hash_seed"], frozenset(keys))
