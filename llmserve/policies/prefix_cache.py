"""Which blocks of a prompt an engine holds in its prefix cache: the engine's own block hashes,
the set of them each replica holds, and the longest cached prefix. Pure.

vLLM names each full KV block of a request by a hash chained over the blocks before it:
`sha256(pickle((parent_hash, tuple(block_token_ids), extra_keys)))`, the first block's parent
being `sha256(pickle(seed))` with the seed `PYTHONHASHSEED` or vLLM's fixed default
(vllm/v1/core/kv_cache_utils.py: `hash_block_tokens`, `init_none_hash`). The router computes the
same chain for a request's prompt tokens, so a block hash in a replica's KV events means that
replica can skip the block's prefill. Only requests without extra keys (no LoRA, no multimodal
input, no `cache_salt`) are hashed here; the others route by load alone.

A hash is kept as its low 64 bits, the int vLLM's KV events carry by default
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`): a replica's whole set then travels in its routing stats
at 8 bytes a block, and a lookup among 10^5 cached blocks is mistaken with odds of 10^-14.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# vLLM's seed for the chain's root when PYTHONHASHSEED is unset and the hash is sha256.
DEFAULT_SEED = "vllm-none-hash"
HASH_ALGOS = ("sha256",)


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def block_key(block_hash: bytes | int) -> int:
    """The compact name of one block: the low 64 bits of vLLM's hash (as its events give it)."""
    if isinstance(block_hash, int):
        return block_hash & 0xFFFF_FFFF_FFFF_FFFF
    return int.from_bytes(block_hash[-8:], "big")


def block_hashes(token_ids: Sequence[int], block_size: int, seed: str | None = None) -> list[bytes]:
    """vLLM's hashes of the full blocks of `token_ids` (a trailing partial block has none)."""
    parent = _sha256(seed if seed is not None else DEFAULT_SEED)
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = _sha256((parent, tuple(token_ids[start : start + block_size]), None))
        out.append(parent)
    return out


def block_keys(token_ids: Sequence[int], block_size: int, seed: str | None = None) -> list[int]:
    return [block_key(h) for h in block_hashes(token_ids, block_size, seed)]


def cached_prefix_blocks(keys: Sequence[int], held: set[int] | frozenset[int]) -> int:
    """How many of a prompt's blocks, from its start, a replica holds.

    The chain makes a block's hash depend on every block before it, so a hit after a miss
    cannot be used by the engine: the count stops at the first miss.
    """
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n


@dataclass
class BlockIndex:
    """The blocks one engine holds, kept from its KV events (BlockStored, BlockRemoved,
    AllBlocksCleared). `version` grows with every change, so a reader can tell a new set."""

    held: set[int] = field(default_factory=set)
    version: int = 0

    def stored(self, hashes: Iterable[bytes | int]) -> None:
        self.held.update(block_key(h) for h in hashes)
        self.version += 1

    def removed(self, hashes: Iterable[bytes | int]) -> None:
        self.held.difference_update(block_key(h) for h in hashes)
        self.version += 1

    def cleared(self) -> None:
        self.held.clear()
        self.version += 1

    def apply(self, event: dict[str, Any]) -> None:
        """One event as vLLM's msgpack encodes it: a map tagged by `type`."""
        kind = event.get("type")
        if kind == "BlockStored":
            # Blocks hashed with extra keys (LoRA, images, cache_salt) never match a prompt's
            # plain hashes; extra_keys has one entry per block, None for a plain one.
            if event.get("lora_name") is None:
                hashes = event.get("block_hashes") or ()
                extra = event.get("extra_keys") or ()
                self.stored(h for i, h in enumerate(hashes) if i >= len(extra) or not extra[i])
        elif kind == "BlockRemoved":
            self.removed(event.get("block_hashes") or ())
        elif kind == "AllBlocksCleared":
            self.cleared()


@dataclass
class PrefixIndex:
    """What a router knows of each replica's prefix cache: the blocks its last report holds,
    plus the prompt blocks this router sent there in the last `recent_s` seconds (the replica
    stores them within one prefill, but reports only every stats period). Clock injected."""

    recent_s: float = 3.0
    _held: dict[str, frozenset[int]] = field(default_factory=dict)
    _versions: dict[str, int] = field(default_factory=dict)
    _recent: dict[str, dict[int, float]] = field(default_factory=dict)

    def is_current(self, replica_id: str, version: int) -> bool:
        return self._versions.get(replica_id) == version

    def update(self, replica_id: str, version: int, keys: frozenset[int]) -> None:
        self._held[replica_id] = keys
        self._versions[replica_id] = version

    def routed(self, replica_id: str, keys: Sequence[int], now_s: float) -> None:
        recent = self._recent.setdefault(replica_id, {})
        for k in keys:
            recent[k] = now_s
        if len(recent) > 4 * len(keys) + 1024:  # amortized: prune only when it has grown
            cutoff = now_s - self.recent_s
            self._recent[replica_id] = {k: t for k, t in recent.items() if t >= cutoff}

    def cached_blocks(self, replica_id: str, keys: Sequence[int], now_s: float) -> int:
        held = self._held.get(replica_id, frozenset())
        recent = self._recent.get(replica_id, {})
        cutoff = now_s - self.recent_s
        n = 0
        for k in keys:
            if k not in held and recent.get(k, cutoff - 1) < cutoff:
                break
            n += 1
        return n

    def drop(self, replica_id: str) -> None:
        self._held.pop(replica_id, None)
        self._versions.pop(replica_id, None)
        self._recent.pop(replica_id, None)

    def replica_ids(self) -> set[str]:
        return set(self._held) | set(self._recent)
