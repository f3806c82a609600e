"""The engine's KV cache events, read inside its replica: which blocks the engine holds.

vLLM's engine core publishes every block it stores or evicts (`kv_events_config`, a ZMQ PUB
socket, msgpack batches numbered in sequence) and keeps recent batches for replay on a second
socket. Both are bound here on `ipc://` paths in a directory only this user can enter: ZMQ has
no authentication, so nothing of it listens on the network. A thread subscribes, first replays
what was published before it connected (and again after any gap in the sequence), and applies
each event to a BlockIndex (llmserve/policies/prefix_cache.py). The replica reports the index's
blocks in its routing stats, through Ray, to the routers.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import msgspec
import zmq

from llmserve.policies.prefix_cache import BlockIndex

logger = logging.getLogger("ray.serve")
END_SEQ = -1
POLL_MS = 200


class KVEventSubscriber:
    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="llmserve-kv-"))  # mode 0700
        self.endpoint = f"ipc://{self._dir}/events"
        self.replay_endpoint = f"ipc://{self._dir}/replay"
        self.index = BlockIndex()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next_seq = 0
        self._thread: threading.Thread | None = None
        self.num_events = 0

    def config(self) -> dict[str, Any]:
        """vLLM's `--kv-events-config` for this subscriber's sockets."""
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
        }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def held(self) -> tuple[int, frozenset[int]]:
        """(version, blocks) of the index, a consistent copy."""
        with self._lock:
            return self.index.version, frozenset(self.index.held)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.connect(self.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        decode = msgspec.msgpack.Decoder().decode
        try:
            self._replay(ctx, decode)
            while not self._stop.is_set():
                if not sub.poll(POLL_MS):
                    continue
                _topic, seq_bytes, payload = sub.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq < self._next_seq:
                    continue  # already applied from the replay
                if seq > self._next_seq:  # missed some (slow joiner, high-water mark): replay
                    self._replay(ctx, decode)
                    if seq < self._next_seq:
                        continue
                self._apply(seq, decode(payload))
        except Exception:
            logger.exception("KV event subscriber stopped; prefix-aware routing sees no updates")
        finally:
            sub.close(linger=0)

    def _replay(self, ctx: zmq.Context, decode) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(self.replay_endpoint)
        try:
            sock.send_multipart((b"", self._next_seq.to_bytes(8, "big")))
            while sock.poll(2000):
                _empty, _topic, seq_bytes, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    return
                if seq >= self._next_seq:
                    self._apply(seq, decode(payload))
            logger.warning("KV event replay did not answer within 2 s")
        finally:
            sock.close(linger=0)

    def _apply(self, seq: int, batch: Any) -> None:
        # KVEventBatch is array-like: [ts, events, data_parallel_rank]; each event a tagged map.
        events = batch[1] if isinstance(batch, (list, tuple)) else batch.get("events", [])
        with self._lock:
            for event in events:
                if isinstance(event, dict):
                    self.index.apply(event)
            self.num_events += len(events)
        self._next_seq = seq + 1
