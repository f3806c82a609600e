"""A simulated engine behind the same seam as VLLMEngine, for relay, policy and load tests.

It models what admission, routing and the relay care about: continuous batching (every running
sequence gets one token per step; a step takes `step_s + per_seq_step_s * running`), at most
`max_num_seqs` running, the rest waiting in priority-then-arrival order, aborts that free a slot
at once, and an OpenAI-shaped HTTP answer (JSON, or SSE frames ending in `data: [DONE]`) whose
frames cost next to nothing to make, so that a relay benchmark measures the relay. It is used
with `source: simulated`; it never stands in for the real engine in tests that claim something
about vLLM.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from llmserve.config.app_config import ModelConfig
from llmserve.protocol.replica_call import CHAT_PATH, COMPLETIONS_PATH, EngineStats
from llmserve.replica.engine import request_usage


@dataclass
class _Seq:
    max_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_generated: int = 0


# Token ids: the answer's n-th token (" tok{n}") is n, every prompt token 0. A prompt of ids
# that ends in answer tokens (a resumed stream's continuation) goes on after the last of them.
PROMPT_TOKEN = 0


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _error_body(message: str, param: str | None, status: int = 400) -> bytes:
    # The shape of vLLM's own error responses.
    return json.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}}
    ).encode()


class SimEngine:
    def __init__(self, model: ModelConfig) -> None:
        self._model = model
        self._sim = model.simulation
        self.max_model_len = model.engine.max_model_len or 2048
        self._max_num_seqs = model.engine.max_num_seqs
        self._running: dict[str, _Seq] = {}
        self._waiting: list[tuple[int, int, str]] = []  # (priority, arrival, id) heap
        self._seqs: dict[str, _Seq] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._dead = False
        self.paths = frozenset({CHAT_PATH, COMPLETIONS_PATH})

    async def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            while self._waiting and len(self._running) < self._max_num_seqs:
                _, _, rid = heapq.heappop(self._waiting)
                if rid in self._seqs:
                    self._running[rid] = self._seqs[rid]
            await asyncio.sleep(self._sim.step_s + self._sim.per_seq_step_s * len(self._running))
            for rid, seq in list(self._running.items()):
                seq.num_generated += 1
                done = seq.num_generated >= seq.max_tokens
                seq.queue.put_nowait(done)
                if done:
                    self._finish(rid)

    def _finish(self, rid: str) -> None:
        self._running.pop(rid, None)
        self._seqs.pop(rid, None)

    # --------------------------------------------------------------------------- the HTTP app

    async def app(self, scope: dict, receive, send) -> None:
        message = await receive()
        path = scope["path"]
        if path not in self.paths:
            await _respond(send, 404, _error_body(f"no route {path}", None, 404))
            return
        try:
            req = self._parse(message.get("body", b""), path)
        except _BadRequest as e:
            await _respond(send, 400, _error_body(str(e), e.param))
            return
        rid = f"sim-{next(self._ids)}"
        seq = _Seq(req["max_tokens"])
        self._seqs[rid] = seq
        heapq.heappush(self._waiting, (req["priority"], next(self._ids), rid))
        self._wake.set()
        usage = request_usage.get()
        if usage is not None:
            usage.num_prompt_tokens += req["num_prompt"]
        chat = path == CHAT_PATH
        start = time.monotonic()
        # As vLLM's server does: a client that leaves aborts the request at once (its slot
        # free for the next step), not when its answer would next be written.
        watch = asyncio.ensure_future(_until_disconnect(receive, seq))
        try:
            if req["stream"]:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")],
                    }
                )
            n = req["first"]
            ids = req["return_token_ids"]
            while True:
                done = await seq.queue.get()
                if done is None:  # the client left
                    return
                n += 1
                if usage is not None:
                    usage.num_completion_tokens += 1
                    usage.last_output_s = time.monotonic() - start
                    if usage.first_output_s is None:
                        usage.first_output_s = usage.last_output_s
                if req["stream"]:
                    await send(
                        {
                            "type": "http.response.body",
                            "more_body": True,
                            "body": _frame(rid, chat, n, done, ids, req["prompt_ids"]),
                        }
                    )
                if done:
                    break
            if req["stream"]:
                tail = b""
                if req["include_usage"]:
                    tail = _usage_frame(rid, chat, req["num_prompt"], n - req["first"])
                await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n"})
            else:
                await _respond(send, 200, _whole(rid, chat, req["num_prompt"], req["first"], n))
        finally:
            watch.cancel()
            self._finish(rid)  # abort: frees the slot for the next step

    def _parse(self, raw: bytes, path: str) -> dict[str, Any]:
        try:
            body = json.loads(raw)
        except ValueError:
            raise _BadRequest("body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("body must be a JSON object")
        if path == CHAT_PATH:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("messages must be a non-empty list", "messages")
            text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            text = body.get("prompt")
            if not isinstance(text, (str, list)) or not text:
                raise _BadRequest("prompt must be a non-empty string", "prompt")
        num_prompt = max(1, len(text) // 4) if isinstance(text, str) else len(text)
        prompt_ids = [PROMPT_TOKEN] * num_prompt if isinstance(text, str) else list(text)
        first = max((t for t in prompt_ids if isinstance(t, int)), default=0)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = self._model.max_tokens_default
        if (
            isinstance(max_tokens, float) and max_tokens.is_integer()
        ):  # JSON's 16.0, as vLLM reads it
            max_tokens = int(max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _BadRequest("max_tokens must be a positive integer", "max_tokens")
        if num_prompt + max_tokens > self.max_model_len:
            raise _BadRequest(
                f"maximum context length is {self.max_model_len} tokens", "max_tokens"
            )
        stream = body.get("stream") or False  # null is "not streamed", as vLLM reads it
        if not isinstance(stream, bool):
            raise _BadRequest("stream must be a boolean", "stream")
        options = body.get("stream_options") or {}
        priority = body.get("priority", 0)
        return {
            "num_prompt": num_prompt,
            "max_tokens": max_tokens,
            "stream": stream,
            "include_usage": isinstance(options, dict) and options.get("include_usage") is True,
            "priority": priority if isinstance(priority, int) else 0,
            "return_token_ids": body.get("return_token_ids") is True,
            "prompt_ids": prompt_ids,
            "first": first,
        }

    # -------------------------------------------------------------------------------- the seam

    async def loaded_adapters(self) -> None:
        return None  # a simulated model has no adapters (llmserve/config/app_config.py)

    async def load_adapter(self, name: str, path: str) -> None:
        raise ValueError(f"adapter {name!r}: a simulated model has no LoRA adapters")

    async def unload_adapter(self, name: str) -> None:
        return None  # nothing to forget: load_adapter registers none

    def cached_blocks(self) -> None:
        return None  # no prefix cache simulated: prefix-aware routing weighs load alone

    def stats(self) -> EngineStats:
        waiting = sum(1 for _, _, rid in self._waiting if rid in self._seqs)
        running = len(self._running)
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            num_unfinished=running + waiting,
            kv_cache_usage=running / self._max_num_seqs,
            healthy=not self._dead,
        )

    async def check_health(self) -> None:
        if self._dead or (self._loop_task is not None and self._loop_task.done()):
            raise RuntimeError("simulated engine is dead")

    def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._dead = True


async def _until_disconnect(receive, seq: _Seq) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    seq.queue.put_nowait(None)


async def _respond(send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _frame(
    rid: str, chat: bool, n: int, done: bool, with_ids: bool, prompt_ids: list[int]
) -> bytes:
    """A chunk as vLLM writes it; with `with_ids` (return_token_ids), the ids of its text and,
    in the first, the prompt's."""
    finish = b'"length"' if done else b"null"
    ids = b"[%d]" % n if with_ids else b"null"
    prompt = b"null"
    if with_ids and n == 1 + max(prompt_ids, default=0):  # the first chunk
        prompt = json.dumps(prompt_ids, separators=(",", ":")).encode()
    kind, text = (b"chat.completion.chunk", b'"delta":{"content":" tok%d"}' % n)
    if not chat:
        kind, text = b"text_completion", b'"text":" tok%d"' % n
    return (
        b'data: {"id":"%s","object":"%s","created":0,"prompt_token_ids":%s,"choices":[{"index":0,'
        b'%s,"finish_reason":%s,"token_ids":%s}]}\n\n'
        % (rid.encode(), kind, prompt, text, finish, ids)
    )


def _usage(num_prompt: int, n: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": n, "total_tokens": num_prompt + n}


def _usage_frame(rid: str, chat: bool, num_prompt: int, n: int) -> bytes:
    obj = "chat.completion.chunk" if chat else "text_completion"
    chunk = {"id": rid, "object": obj, "choices": [], "usage": _usage(num_prompt, n)}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _whole(rid: str, chat: bool, num_prompt: int, first: int, n: int) -> bytes:
    text = "".join(f" tok{i}" for i in range(first + 1, n + 1))
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
    obj = "chat.completion" if chat else "text_completion"
    return json.dumps(
        {"id": rid, "object": obj, "choices": [choice], "usage": _usage(num_prompt, n - first)}
    ).encode()
