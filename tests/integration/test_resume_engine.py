"""Resuming a stream, on the real engine (one vLLM engine of the default model, no Ray): what a
replica does for the Router when a stream's replica dies or the stream is preempted
(llmserve/replica/resumable.py). The Router's side runs on Serve in test_preemption.py and the
chaos suite's engine kill.

- A tracked stream's bytes are the untracked stream's (the ids vLLM adds are taken out).
- An answer cut anywhere and continued from the ids its client has is the unbroken answer,
  text and usage, for chat and completions, also where the cut falls inside a character.
- A stream aborted mid-way (as preemption aborts it) and continued on the same engine is the
  unbroken answer too (its blocks are then in the prefix cache).
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from llmserve.config.app_config import ModelConfig
from llmserve.policies.stream_flush import FlushPolicy
from llmserve.protocol.openai_protocol import rewrite_body
from llmserve.protocol.replica_call import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    IDS_MARK,
    ReplicaRequest,
    ReplyHead,
    Resume,
    Usage,
    parse_ids,
    split_part,
)
from llmserve.replica.engine import request_usage
from llmserve.replica.engine.asgi_call import AsgiCall, reply_parts
from llmserve.replica.engine.vllm_engine import VLLMEngine
from llmserve.replica.resumable import TrackedReply
from tests.integration.apps import DEFAULT

pytestmark = pytest.mark.timeout(900)
MAX_TOKENS = 40
# French with accents: characters that take two tokens, so some cut falls inside one.
PROMPTS = {
    CHAT_PATH: {"messages": [{"role": "user", "content": "Écris un poème sur la mer, é è à ç."}]},
    COMPLETIONS_PATH: {"prompt": "Les élèves français à l'école"},
}
JSON = (("content-type", "application/json"),)


async def _run(engine: VLLMEngine, request: ReplicaRequest, stop_after: int | None = None):
    """The reply's items as the Router gets them; with `stop_after`, the client's side of a
    stream cut after that many items (its engine request aborted)."""
    usage = Usage()
    tracked = TrackedReply(request) if request.track_tokens else None
    token = request_usage.set(usage)
    call = AsgiCall(engine.app, tracked.engine_request if tracked else request)
    request_usage.reset(token)
    items = []
    try:
        async for part in reply_parts(call, usage, FlushPolicy(0), "r", lambda: False):
            items.append(tracked.item(part) if tracked else part)
            if stop_after is not None and len(items) == stop_after:
                break
    finally:
        await call.close()  # aborts the engine request
    return items


def _bytes(items) -> bytes:
    """What the client gets of the items (a tracked part's ids taken off, as the Router does)."""
    return b"".join(i.partition(IDS_MARK)[0] if isinstance(i, bytes) else i.body for i in items)


def _text(data: bytes, chat: bool) -> str:
    out = ""
    for frame in data.split(b"\n\n"):
        if frame.startswith(b"data: {"):
            for c in json.loads(frame[6:]).get("choices", []):
                out += (c["delta"].get("content") or "") if chat else c["text"]
    return out


def _same_but_ids(data: bytes) -> bytes:
    data = re.sub(rb'"id":"[^"]*"', b'"id":"X"', data)
    return re.sub(rb'"created":[0-9]+', b'"created":0', data)


def _resume_point(items) -> Resume:
    head = items[0]
    assert isinstance(head, ReplyHead) and head.stream_start is not None
    ids = [head.token_ids, *(split_part(item)[1] for item in items[1:])]
    return Resume(head.stream_start, parse_ids(ids))


@pytest.fixture(scope="module")
def engine(model_dirs):
    model = ModelConfig(
        name=DEFAULT,
        source=str(model_dirs[DEFAULT]),
        # float32: the resumed tokens' keys are computed in one prefill where the unbroken
        # answer computed them one step at a time; in bf16 the two round differently enough
        # that a near tie between two tokens can go the other way (docs/api.md).
        engine={
            "dtype": "float32",
            "enforce_eager": True,
            "max_model_len": 1024,
            "max_num_seqs": 4,
            "cpu_kv_cache_space_gib": 1,
        },
    )
    engine = VLLMEngine(model, str(model_dirs[DEFAULT]))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    yield engine, loop
    engine.shutdown()
    loop.close()


@pytest.mark.parametrize("path", [CHAT_PATH, COMPLETIONS_PATH], ids=["chat", "completions"])
def test_a_stream_cut_anywhere_goes_on_as_if_unbroken(engine, path):
    engine, loop = engine
    chat = path == CHAT_PATH
    body = {
        "model": DEFAULT,
        **PROMPTS[path],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,  # every answer MAX_TOKENS long, wherever the model would stop
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tracked_body = rewrite_body(body, return_token_ids=True)

    def request(rid: str, **kw) -> ReplicaRequest:
        return ReplicaRequest(rid, path, tracked_body, JSON, track_tokens=True, **kw)

    plain = loop.run_until_complete(
        _run(engine, ReplicaRequest("p", path, rewrite_body(body), JSON))
    )
    tracked = loop.run_until_complete(_run(engine, request("t")))
    assert _same_but_ids(_bytes(tracked)) == _same_but_ids(_bytes(plain))
    whole = _text(_bytes(plain), chat)
    assert len(whole) > 40, whole
    # Cuts: at the start, right after an item whose token brought no text yet (inside a
    # character: its id is held back), mid-way and just before the end.
    inside = [k + 1 for k, item in enumerate(tracked[1:-1], 1) if not split_part(item)[1]][:2]
    cuts = sorted({1, *inside, len(tracked) // 2, len(tracked) - 2})
    for cut in cuts:
        point = _resume_point(tracked[:cut])
        rest = loop.run_until_complete(_run(engine, request(f"c{cut}", resume=point)))
        joined = _text(_bytes(tracked[:cut]) + _bytes(rest), chat)
        assert joined == whole, (cut, whole, joined)
        usage = rest[-1].usage  # the whole answer, once
        assert usage.num_completion_tokens == MAX_TOKENS, (cut, usage)
        assert usage.num_prompt_tokens == len(point.start.prompt_token_ids)
    print(f"\n{path}: {len(tracked)} items, cut after {cuts}, inside a character after {inside}")
    assert path == COMPLETIONS_PATH or inside, "no character over two tokens: change the prompt"


def test_a_stream_aborted_mid_way_goes_on_on_the_same_engine(engine):
    """What preemption does: the engine request aborted, then continued from the same ids."""
    engine, loop = engine
    body = {"model": DEFAULT, **PROMPTS[CHAT_PATH], "max_tokens": MAX_TOKENS, "temperature": 0}
    body.update(stream=True, ignore_eos=True)
    tracked_body = rewrite_body(body, return_token_ids=True)
    whole_items = loop.run_until_complete(
        _run(engine, ReplicaRequest("w", CHAT_PATH, tracked_body, JSON, track_tokens=True))
    )
    first = loop.run_until_complete(
        _run(
            engine,
            ReplicaRequest("a", CHAT_PATH, tracked_body, JSON, track_tokens=True),
            stop_after=15,
        )
    )
    rest = loop.run_until_complete(
        _run(
            engine,
            ReplicaRequest(
                "b", CHAT_PATH, tracked_body, JSON, track_tokens=True, resume=_resume_point(first)
            ),
        )
    )
    assert _text(_bytes(first) + _bytes(rest), True) == _text(_bytes(whole_items), True)
    assert engine.stats().num_unfinished == 0  # the aborted request left nothing behind
