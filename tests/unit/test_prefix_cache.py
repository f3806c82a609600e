"""Prefix-cache matching (llmserve/policies/prefix_cache.py): the block hashes are vLLM's own,
the block index follows the engine's events, the longest cached prefix stops at the first miss,
and the router's view keeps recently routed blocks only for a while."""

from __future__ import annotations

import pytest

from llmserve.policies.prefix_cache import (
    BlockIndex,
    PrefixIndex,
    block_hashes,
    block_key,
    block_keys,
    cached_prefix_blocks,
)
from llmserve.protocol.replica_call import CachedBlocks


@pytest.mark.parametrize("seed", [None, "0", "12345"])
def test_block_hashes_are_vllms(seed, monkeypatch):
    import vllm.v1.core.kv_cache_utils as kv
    from vllm.utils.hashing import sha256

    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    kv.init_none_hash(sha256)
    tokens = list(range(1000, 1000 + 3 * 16 + 5))  # three full blocks and a partial one
    parent, expected = None, []
    for i in range(3):
        parent = kv.hash_block_tokens(sha256, parent, tokens[16 * i : 16 * (i + 1)], None)
        expected.append(parent)
    assert block_hashes(tokens, 16, seed) == expected
    # As vLLM's KV events carry them by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
    assert block_keys(tokens, 16, seed) == [
        block_key(kv.maybe_convert_block_hash(h)) for h in expected
    ]


def test_seed_and_tokens_change_every_later_block():
    tokens = list(range(64))
    base = block_keys(tokens, 16)
    assert len(base) == 4 and len(set(base)) == 4
    assert block_keys(tokens, 16, "1") != base
    changed = block_keys([99, *tokens[1:]], 16)
    assert all(a != b for a, b in zip(changed, base, strict=True))  # the chain carries it on
    assert block_keys(tokens[:15], 16) == []


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        (set(), 0),
        ({1}, 1),
        ({1, 2, 3}, 3),
        ({1, 3}, 1),  # block 3 is useless without block 2
        ({2, 3}, 0),
    ],
)
def test_cached_prefix_stops_at_first_miss(held, expected):
    assert cached_prefix_blocks([1, 2, 3], held) == expected


def test_block_index_follows_events():
    idx = BlockIndex()
    idx.apply({"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None})
    idx.apply({"type": "BlockStored", "block_hashes": [b"\x00" * 24 + (3).to_bytes(8, "big")]})
    assert idx.held == {1, 2, 3} and idx.version == 2
    idx.apply({"type": "BlockStored", "block_hashes": [9], "lora_name": "a"})  # other keys
    idx.apply({"type": "BlockStored", "block_hashes": [8, 6], "extra_keys": [["salt"], None]})
    idx.apply({"type": "BlockStored", "block_hashes": [4, 5], "extra_keys": [None, None]})
    assert idx.held == {1, 2, 3, 4, 5, 6}
    idx.apply({"type": "BlockRemoved", "block_hashes": [2, 7]})
    assert idx.held == {1, 3, 4, 5, 6}
    version = idx.version
    idx.apply({"type": "AllBlocksCleared"})
    assert idx.held == set() and idx.version == version + 1
    idx.apply({"type": "Unknown"})
    assert idx.version == version + 1


def test_cached_blocks_travel_as_bytes():
    c = CachedBlocks(7, 128, None, frozenset({1, 2**63 + 5, 2**64 - 1}))
    stats = c.to_stats()
    assert isinstance(stats["keys"], bytes) and len(stats["keys"]) == 24
    assert CachedBlocks.from_stats(stats) == c


def test_prefix_index_reported_and_recent():
    idx = PrefixIndex(recent_s=3.0)
    idx.update("a", 1, frozenset({1, 2}))
    assert idx.is_current("a", 1) and not idx.is_current("a", 2)
    assert idx.cached_blocks("a", [1, 2, 3], now_s=0.0) == 2
    assert idx.cached_blocks("b", [1, 2, 3], now_s=0.0) == 0
    # Routed there: counted as cached until the replica's own reports can say.
    idx.routed("b", [1, 2, 3], now_s=10.0)
    assert idx.cached_blocks("b", [1, 2, 3, 4], now_s=12.0) == 3
    assert idx.cached_blocks("b", [1, 2, 3], now_s=13.5) == 0
    # A report without blocks the router had sent: the recent ones still count (not yet stored).
    idx.routed("a", [1, 2, 3], now_s=20.0)
    idx.update("a", 2, frozenset())
    assert idx.cached_blocks("a", [1, 2, 3], now_s=21.0) == 3
    assert idx.cached_blocks("a", [1, 2, 3], now_s=24.0) == 0
    idx.drop("a")
    assert idx.replica_ids() == {"b"}
