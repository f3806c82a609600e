"""The request router's prefix-aware path (llmserve/request_router/request_router.py) without Ray
running: it reads each replica's reported blocks, hashes the request's prompt once, sends it where
the prompt is cached, and notes why for the Router."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from llmserve.policies.prefix_cache import block_keys
from llmserve.protocol.replica_call import CHAT_PATH, CachedBlocks, ReplicaRequest, RoutingStats
from llmserve.request_router.request_router import LLMAwareRequestRouter
from tests.unit.router_helpers import FakeReplica, llm_router

BLOCK = 4


class Tokens:
    """Stands in for PromptTokens: a prompt's tokens are its words' lengths."""

    calls = 0

    def token_ids(self, path, body):
        type(self).calls += 1
        return [len(w) for m in body["messages"] for w in m["content"].split()]


def router(**kwargs) -> LLMAwareRequestRouter:
    r = llm_router(model="m", prefix={"model_dir": "/nowhere"}, **kwargs)
    r._tokens = Tokens()
    r._decisions = False  # no Ray metrics here
    return r


def body(text: str) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()


def pending(text: str, n: int) -> SimpleNamespace:
    return SimpleNamespace(
        args=(ReplicaRequest(f"req-{n}", CHAT_PATH, body(text)),),
        metadata=SimpleNamespace(session_id="", request_id=f"req-{n}", internal_request_id=f"i{n}"),
    )


def note_of(p: SimpleNamespace):
    """What the request router noted on the request for the Router."""
    return p.args[0].route.note


def replica(uid: str, cached_text: str = "", version: int = 1, **load) -> FakeReplica:
    tokens = Tokens().token_ids(CHAT_PATH, json.loads(body(cached_text)))
    keys = frozenset(block_keys(tokens, BLOCK))
    blocks = CachedBlocks(version, BLOCK, None, keys).pack()
    return FakeReplica(
        uid, RoutingStats(timestamp_s=time.time(), cached_blocks=blocks, **load).to_stats()
    )


PROMPT = "a bb ccc dddd a bb ccc dddd a bb ccc dddd"  # 12 tokens, 3 blocks


async def test_request_goes_where_its_prompt_is_cached_and_says_why():
    r = router()
    candidates = [replica("cold"), replica("warm", PROMPT), replica("colder")]
    for n in range(5):
        p = pending(PROMPT + " tail", n)
        ranks = await r.choose_replicas(candidates, p)
        assert ranks[0][0].uid == "warm"
        note = note_of(p)
        assert (note.reason, note.replica, note.cached_tokens) == ("prefix", "warm", 12)
        assert note.runner_up in ("cold", "colder") and note.runner_up_cached_tokens == 0


async def test_prompt_is_hashed_once_per_request():
    r = router()
    candidates = [replica("a"), replica("b", PROMPT)]
    Tokens.calls = 0
    p = pending(PROMPT, 99)
    for _ in range(3):  # Ray asks again while every replica is full
        await r.choose_replicas(candidates, p)
    assert Tokens.calls == 1


async def test_a_request_for_an_adapter_gets_no_credit_for_the_base_models_blocks():
    """vLLM keys an adapter's blocks by the adapter: the base model's cached prompt is no use to
    it, so the prompt is not hashed and only the adapter's holder is credited."""
    r = router()
    candidates = [replica("warm", PROMPT), replica("cold")]
    candidates[1].routing_stats["adapters"] = ["sql-lora"]
    Tokens.calls = 0
    p = pending(PROMPT, 7)
    p.args = (ReplicaRequest("req-7", CHAT_PATH, body(PROMPT), adapter="sql-lora"),)
    ranks = await r.choose_replicas(candidates, p)
    assert ranks[0][0].uid == "cold" and Tokens.calls == 0
    note = note_of(p)
    assert (note.reason, note.adapter_held, note.cached_tokens) == ("adapter", True, 0)


async def test_loaded_holder_loses_its_credit():
    r = router(weights={"prefix_load_margin": 2.0})
    candidates = [replica("idle"), replica("warm", PROMPT, num_waiting=6)]
    p = pending(PROMPT, 1)
    ranks = await r.choose_replicas(candidates, p)
    assert ranks[0][0].uid == "idle"
    assert note_of(p).reason == "load"


async def test_a_new_prefix_sticks_to_where_it_was_sent():
    """No replica reports the prompt yet: the first request goes by load, the next ones with
    the same prefix follow it (the blocks it sent count until the replica reports)."""
    r = router()
    candidates = [replica("a"), replica("b")]
    first = (await r.choose_replicas(candidates, pending(PROMPT, 1)))[0][0].uid
    r.on_request_routed(pending(PROMPT, 1), candidates[0].replica_id, None)
    for n in range(2, 6):
        assert (await r.choose_replicas(candidates, pending(PROMPT, n)))[0][0].uid == first


async def test_without_reports_or_prefix_config_it_routes_by_load():
    plain = router()
    plain._prefix = None
    cached = [replica("a"), replica("b", PROMPT)]
    p = pending(PROMPT, 1)
    await plain.choose_replicas(cached, p)
    assert note_of(p).reason == "p2c"
    no_reports = router()
    bare = [
        FakeReplica("a", RoutingStats(timestamp_s=time.time()).to_stats()),
        FakeReplica("b", None),
    ]
    p = pending(PROMPT, 2)
    await no_reports.choose_replicas(bare, p)
    assert note_of(p).reason == "p2c"


async def test_replaced_replica_leaves_the_index(monkeypatch):
    from ray.serve.request_router import RequestRouter

    # Ray's base class keeps its own replica table (not set up here); our index is checked.
    monkeypatch.setattr(RequestRouter, "update_replicas", lambda self, replicas: None)
    r = router()
    await r.choose_replicas([replica("a", PROMPT), replica("b")], pending(PROMPT, 1))
    assert r._index.replica_ids() == {"a", "b"}
    r.update_replicas([replica("b")])
    assert r._index.replica_ids() == {"b"}
