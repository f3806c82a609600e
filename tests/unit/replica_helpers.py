"""An LLMServer replica around a stub engine, without Ray running: shared by the replica-stats
and adapter tests (test_replica_stats.py, test_replica_adapters.py)."""

from __future__ import annotations

from types import SimpleNamespace

from llmserve.protocol.replica_call import CachedBlocks, EngineStats


class StubEngine:
    def __init__(self, stats: EngineStats, cached: CachedBlocks | None) -> None:
        self._stats, self.cached = stats, cached
        self.adapters: frozenset[str] | None = None

    async def loaded_adapters(self) -> frozenset[str] | None:
        return self.adapters

    def stats(self) -> EngineStats:
        return self._stats

    def cached_blocks(self) -> CachedBlocks | None:
        return self.cached

    def shutdown(self) -> None:
        return None  # no engine process to end


def server(stats: EngineStats, cached: CachedBlocks | None = None, queued: float = 0.0):
    """An LLMServer replica around a stub engine, without Ray running."""
    from llmserve.replica.llm_server import LLMServer

    s = object.__new__(LLMServer.func_or_class)
    s._engine = StubEngine(stats, cached)
    s._num_probing, s._unhealthy_reason, s._packed = 0, None, None
    s._adapters, s._adapter_metrics = None, SimpleNamespace(export=lambda held: None)
    s._runtime_adapters = SimpleNamespace(names=lambda: None)
    s._replica_id = "local"

    async def router_queued() -> float:
        return queued

    s._router_queued = router_queued
    return s


ENGINE = EngineStats(
    num_running=3, num_waiting=4, num_unfinished=7, kv_cache_usage=0.5, healthy=True
)
