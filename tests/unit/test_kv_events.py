"""The replica's KV event reader (llmserve/replica/engine/kv_events.py) against vLLM's own ZMQ
publisher: events published before it connected come by replay, later ones live, and the block
set follows stores, evictions and clears. The sockets are ipc paths in a private directory."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import vllm.distributed.kv_events as kv_events

from llmserve.policies.prefix_cache import block_key
from llmserve.replica.engine.kv_events import KVEventSubscriber


def stored(*hashes: int | bytes) -> kv_events.BlockStored:
    return kv_events.BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=list(range(16 * len(hashes))),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None] * len(hashes),
    )


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_reader_follows_vllms_publisher():
    sub = KVEventSubscriber()
    folder = Path(sub.endpoint.removeprefix("ipc://")).parent
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700  # no one else may connect
    pub = kv_events.ZmqEventPublisher(
        data_parallel_rank=0, endpoint=sub.endpoint, replay_endpoint=sub.replay_endpoint
    )
    try:
        # Before the reader connects: only the replay can bring these.
        pub.publish(kv_events.KVEventBatch(ts=time.time(), events=[stored(1, 2, 3)]))
        time.sleep(0.3)
        sub.start()
        wait_for(lambda: sub.held()[1] == {1, 2, 3})
        pub.publish(
            kv_events.KVEventBatch(
                ts=time.time(),
                events=[
                    stored(b"\x07" * 32),
                    kv_events.BlockRemoved(block_hashes=[2], medium="GPU"),
                ],
            )
        )
        wait_for(lambda: sub.held()[1] == {1, 3, block_key(b"\x07" * 32)})
        version = sub.held()[0]
        pub.publish(kv_events.KVEventBatch(ts=time.time(), events=[kv_events.AllBlocksCleared()]))
        wait_for(lambda: sub.held() == (version + 1, frozenset()))
    finally:
        pub.shutdown()
        sub.stop()
    assert not folder.exists()
