"""The stats a replica reports to Serve (llmserve/protocol/replica_call.py): `RoutingStats` for the
request router, `AutoscalingStats` for the autoscaling policy, `PackedBlocks` inside the former.

Their wire format (plain dicts, which Serve's controller holds), the round trip, the defaults of
a partial dict (a replica that has not reported yet, or an older one), and each producer's output
(LLMServer.record_routing_stats / record_autoscaling_stats) read by its consumers
(llmserve/request_router/request_router.py, llmserve/autoscaling/ray_policy.py): a key renamed on
one end only fails here. Only the wire-format table spells the keys; the other cases go through the
classes.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from llmserve.protocol.replica_call import (
    AutoscalingStats,
    CachedBlocks,
    EngineStats,
    PackedBlocks,
    RoutingStats,
)
from tests.unit.replica_helpers import ENGINE, server

BLOCKS = CachedBlocks(3, 16, "0", frozenset({5, 1, 2**64 - 1}))
PACKED = BLOCKS.pack()
FULL = RoutingStats(
    num_running=2,
    num_waiting=5,
    kv_cache_usage=0.25,
    healthy=False,
    timestamp_s=1_000.5,
    cached_blocks=PACKED,
    adapters=("sql-lora", "support-lora"),
)


# -- wire format -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "stats, wire",
    [
        (
            FULL,
            {
                "num_running": 2,
                "num_waiting": 5,
                "kv_cache_usage": 0.25,
                "healthy": False,
                "timestamp_s": 1_000.5,
                "cached_blocks": {
                    "version": 3,
                    "block_size": 16,
                    "hash_seed": "0",
                    "keys": PACKED.keys,
                },
                "adapters": ["sql-lora", "support-lora"],
            },
        ),
        (
            RoutingStats(num_running=0, num_waiting=0, kv_cache_usage=0.0, timestamp_s=9.0),
            {  # no cache, no LoRA: no cached_blocks or adapters key at all
                "num_running": 0,
                "num_waiting": 0,
                "kv_cache_usage": 0.0,
                "healthy": True,
                "timestamp_s": 9.0,
            },
        ),
        (
            AutoscalingStats(engine_running=3.0, engine_waiting=1.0, router_queued=7.0),
            {"engine_running": 3.0, "engine_waiting": 1.0, "router_queued": 7.0},
        ),
    ],
)
def test_wire_format(stats, wire):
    """What Serve holds and older or newer replicas send: renaming a key breaks them."""
    assert stats.to_stats() == wire
    assert type(stats).from_stats(wire) == stats


def test_blocks_travel_packed_8_bytes_a_key_and_unpack_to_the_set():
    assert isinstance(PACKED.keys, bytes) and len(PACKED.keys) == 8 * len(BLOCKS.keys)
    assert PACKED.unpack() == BLOCKS
    assert CachedBlocks.from_stats(BLOCKS.to_stats()) == BLOCKS
    assert PackedBlocks.from_stats(PACKED.to_stats()) == PACKED


# -- round trip ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stats",
    [
        RoutingStats(),
        FULL,
        RoutingStats(num_waiting=1, timestamp_s=2.0),
        RoutingStats(cached_blocks=CachedBlocks(0, 16, None, frozenset()).pack()),
        AutoscalingStats(),
        AutoscalingStats(engine_running=1.0, engine_waiting=2.0, router_queued=3.0),
        PACKED,
    ],
)
def test_round_trip(stats):
    d = stats.to_stats()
    assert type(d) is dict and type(stats).from_stats(d) == stats


# -- partial dicts ---------------------------------------------------------------------


def _partial(stats, *names: str) -> dict:
    """`stats.to_stats()` with only the keys of `names`: what an older replica might send."""
    return {k: v for k, v in stats.to_stats().items() if k in names}


@pytest.mark.parametrize(
    "case, d, expected",
    [
        ("not reported yet (None)", None, RoutingStats()),
        ("not reported yet ({})", {}, RoutingStats()),
        ("healthy unless it says so", _partial(FULL, "num_waiting"), RoutingStats(num_waiting=5)),
        ("says unhealthy", _partial(FULL, "healthy"), RoutingStats(healthy=False)),
        ("no stamp", _partial(FULL, "num_running"), RoutingStats(num_running=2)),
        (
            "stamp and cache only",
            _partial(FULL, "timestamp_s", "cached_blocks"),
            RoutingStats(timestamp_s=1_000.5, cached_blocks=PACKED),
        ),
        (
            "a key it does not know",
            {**_partial(FULL, "healthy"), "new": 1},
            RoutingStats(healthy=False),
        ),
    ],
)
def test_routing_stats_defaults(case, d, expected):
    assert RoutingStats.from_stats(d) == expected, case


def test_routing_stats_defaults_are_the_old_get_defaults():
    s = RoutingStats.from_stats({})
    assert (s.num_running, s.num_waiting, s.kv_cache_usage) == (None, None, None)
    assert (s.healthy, s.timestamp_s, s.cached_blocks) == (True, None, None)


FULL_AUTOSCALING = AutoscalingStats(engine_running=4.0, engine_waiting=2.0, router_queued=9.0)


@pytest.mark.parametrize(
    "d, expected",
    [
        (None, AutoscalingStats(0.0, 0.0, 0.0)),
        ({}, AutoscalingStats(0.0, 0.0, 0.0)),
        (_partial(FULL_AUTOSCALING, "engine_running"), AutoscalingStats(engine_running=4.0)),
        (
            {**_partial(FULL_AUTOSCALING, "router_queued"), "other_metric": 1.0},
            AutoscalingStats(router_queued=9.0),
        ),
    ],
)
def test_autoscaling_stats_defaults(d, expected):
    assert AutoscalingStats.from_stats(d) == expected


@pytest.mark.parametrize(
    "now_s, timestamp_s, expected",
    [(10.0, None, None), (10.0, 7.5, 2.5), (10.0, 10.0, 0.0), (10.0, 13.0, 0.0)],
)
def test_age(now_s, timestamp_s, expected):
    assert RoutingStats(timestamp_s=timestamp_s).age_s(now_s) == expected


# -- Ray's aggregated metrics ----------------------------------------------------------


def aggregated(reports: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{replica: its report} as Ray hands it to a policy: {key: {replica: value}}, each value
    aggregated over the look-back window (ray/serve/_private/autoscaling_state.py,
    `_get_aggregated_custom_metrics`); one sample per replica here."""
    out: dict[str, dict[str, float]] = {}
    for replica_id, report in reports.items():
        for key, value in report.items():
            out.setdefault(key, {})[replica_id] = value
    return out


A = AutoscalingStats(engine_running=4.0, engine_waiting=1.0, router_queued=6.0)
B = AutoscalingStats(engine_running=2.0, engine_waiting=0.0, router_queued=6.0)


@pytest.mark.parametrize(
    "case, metrics, expected",
    [
        ("no metrics (scale from zero)", None, {}),
        ("empty", {}, {}),
        ("two replicas", aggregated({"a": A.to_stats(), "b": B.to_stats()}), {"a": A, "b": B}),
        (
            "an older replica without router_queued",
            aggregated({"a": A.to_stats(), "b": _partial(B, "engine_running")}),
            {"a": A, "b": AutoscalingStats(engine_running=2.0)},
        ),
        ("a key Ray has but no replica", {"engine_running": {}}, {}),
    ],
)
def test_per_replica(case, metrics, expected):
    assert AutoscalingStats.per_replica(metrics) == expected, case


# -- producer -> consumer --------------------------------------------------------------


async def test_routing_stats_reach_the_request_router():
    from llmserve.policies.routing import ReplicaLoad
    from llmserve.request_router.request_router import replica_load
    from tests.unit.router_helpers import FakeReplica, llm_router

    now_s = time.time()
    s = server(ENGINE, BLOCKS)
    replica = FakeReplica("r", await s.record_routing_stats())
    load = replica_load(replica, 2, now_s + 1.0)
    assert load == ReplicaLoad(
        "r", 2, num_waiting=4, num_running=3, kv_cache_usage=0.5, stats_age_s=load.stats_age_s
    )
    assert 0.0 < load.stats_age_s <= 1.0 + (time.time() - now_s)
    s._unhealthy_reason = "hung"
    replica.routing_stats = await s.record_routing_stats()
    assert replica_load(replica, 0, time.time()).healthy is False
    # The block set the router's index takes from the same report.
    router = llm_router(prefix={"model_dir": "unused"})
    router._prompt_tokens = lambda: None  # no tokenizer: only the index is refreshed
    pending = SimpleNamespace(args=(), metadata=SimpleNamespace(internal_request_id="i1"))
    await router._prompt_keys([replica], pending)
    assert router._index.is_current("r", BLOCKS.version)
    assert router._index.cached_blocks("r", [5, 2**64 - 1, 1, 7], time.time()) == 3


async def test_blocks_are_packed_once_per_version_and_absent_without_a_cache():
    s = server(ENGINE, BLOCKS)

    async def blocks() -> PackedBlocks | None:
        return RoutingStats.from_stats(await s.record_routing_stats()).cached_blocks

    first, again = await blocks(), await blocks()
    assert first == PACKED and first.keys is again.keys
    s._engine.cached = CachedBlocks(4, 16, "0", frozenset({8}))
    assert (await blocks()).unpack() == s._engine.cached
    s._engine.cached = None
    assert await blocks() is None  # and no key at all: test_wire_format


async def test_autoscaling_stats_reach_the_policy(monkeypatch):
    from ray.serve.config import AutoscalingContext

    import llmserve.autoscaling.ray_policy as ray_policy

    seen = []

    def decide(signals, params, state):
        seen.append(signals)
        return signals.target_replicas, state

    monkeypatch.setattr(ray_policy, "decide", decide)
    busy = EngineStats(5, 2, 7, 0.9, True)
    reports = {
        "a": await server(ENGINE, queued=6.0).record_autoscaling_stats(),
        "b": await server(busy, queued=6.0).record_autoscaling_stats(),
    }
    ctx = AutoscalingContext(
        deployment_id=None,
        deployment_name="llm-m",
        app_name="llmserve",
        current_num_replicas=2,
        target_num_replicas=2,
        running_replicas=["a", "b"],
        total_num_requests=99.0,  # ignored while replicas report
        total_queued_requests=None,
        aggregated_metrics=lambda: aggregated(reports),
        raw_metrics=None,
        capacity_adjusted_min_replicas=0,
        capacity_adjusted_max_replicas=8,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=50.0,
        config=None,
    )
    policy = ray_policy.LLMQueueAutoscalingPolicy(min_replicas=0, max_replicas=8)
    assert policy(ctx)[0] == 2
    (signals,) = seen
    assert (signals.engine_running, signals.engine_waiting, signals.router_queued) == (
        8.0,
        6.0,
        6.0,
    )
