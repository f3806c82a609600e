"""A replica's look at the LoRA adapters its engine holds (llmserve/replica/llm_server.py): what it
reports in its routing stats, what the request router makes of it, and the load and eviction
counts (llmserve/observability/metrics.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from llmserve.protocol.replica_call import RoutingStats
from tests.unit.replica_helpers import ENGINE, server


async def test_adapters_the_engine_holds_reach_the_request_router(monkeypatch):
    """The watchdog's look at the engine's adapters goes out in the routing stats; the request
    router sends a request naming one to the replica holding it, and notes that it held it."""
    from llmserve.protocol.replica_call import ReplicaRequest
    from llmserve.replica import llm_server
    from tests.unit.router_helpers import FakeReplica, llm_router, request

    holder, other = server(ENGINE), server(ENGINE)
    holder._engine.adapters, other._engine.adapters = frozenset({"sql-lora"}), frozenset()
    exported: list[frozenset[str]] = []
    holder._adapter_metrics = SimpleNamespace(export=exported.append)
    for s in (holder, other):
        await s._look_at_adapters()
    assert exported == [frozenset({"sql-lora"})]
    assert RoutingStats.from_stats(await holder.record_routing_stats()).adapters == ("sql-lora",)
    replicas = [
        FakeReplica("holder", await holder.record_routing_stats()),
        FakeReplica("other", await other.record_routing_stats()),
    ]
    router = llm_router()
    for i in range(6):
        pending = request()
        body = ReplicaRequest(f"a{i}", "/v1/chat/completions", b"{}", adapter="sql-lora")
        pending.args = (body,)
        ranks = await router.choose_replicas(replicas, pending)
        assert ranks[0][0].replica_id.unique_id == "holder"
        note = body.route.note
        assert (note.reason, note.adapter_held) == ("adapter", True)

    # An engine that does not answer keeps the last look (the watchdog judges the engine).
    async def hangs():
        await asyncio.sleep(60)

    monkeypatch.setattr(llm_server, "ADAPTER_LOOK_TIMEOUT_S", 0.01)
    holder._engine.loaded_adapters = hangs
    await holder._look_at_adapters()
    assert holder._adapters == frozenset({"sql-lora"}) and len(exported) == 1


def test_adapter_loads_and_evictions_are_the_changes_between_two_looks():
    from llmserve.observability.metrics import ReplicaAdapterMetrics

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def inc(self, n, tags):
            self.calls.append((tags["adapter"], n))

        def set(self, v, tags):
            self.calls.append((tags["adapter"], v))

    m = object.__new__(ReplicaAdapterMetrics)
    m._model, m._last = "base", frozenset()
    m.loads, m.evictions, m.held = Recorder(), Recorder(), Recorder()
    m.export(frozenset({"a", "b"}))  # at start: both loaded
    m.export(frozenset({"a", "b"}))  # nothing changed: nothing counted
    m.export(frozenset({"a", "c"}))  # c loaded on demand, b evicted
    assert sorted(m.loads.calls) == [("a", 1), ("b", 1), ("c", 1)]
    assert m.evictions.calls == [("b", 1)]
    assert sorted(m.held.calls) == [("a", 1), ("b", 0), ("b", 1), ("c", 1)]


async def test_a_runtime_adapter_goes_only_to_replicas_that_registered_it():
    """While a user_config change rolls out, a replica that has not registered the new adapter
    would answer 404: its requests go to those that did, however loaded; others as before."""
    from llmserve.protocol.replica_call import ReplicaRequest
    from llmserve.replica.runtime_adapters import RuntimeAdapterSet
    from tests.unit.router_helpers import llm_router, replica, request

    names = RuntimeAdapterSet(None, None, "", None)
    assert names.names() is None  # nothing registered: absent from the stats
    names.loaded = {"new-lora": None, "a-lora": None}
    assert names.names() == ("a-lora", "new-lora")
    registered = replica("new", 0.1, num_running=30, num_waiting=8, runtime_adapters=names.names())
    stale = replica("old", 0.1, num_running=0, num_waiting=0)
    router = llm_router()
    went = []
    for i, adapter in enumerate(["new-lora"] * 5 + [None] * 5):
        pending = request()
        pending.args = (ReplicaRequest(f"r{i}", "/v1/completions", b"{}", adapter=adapter),)
        ranks = await router.choose_replicas([stale, registered], pending)
        went.append(ranks[0][0].replica_id.unique_id)
    assert went == ["new"] * 5 + ["old"] * 5
