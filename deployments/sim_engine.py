"""A simulated engine behind the same seam as VLLMEngine, for policy and load tests.

It models what admission and routing care about: continuous batching (every running sequence
gets one token per step; a step takes `step_s + per_seq_step_s * running`), at most
`max_num_seqs` running, the rest waiting in priority-then-arrival order, and aborts that free a
slot at once. It is used with `source: simulated` in a model's config; it never stands in for
the real engine in tests that claim something about vLLM.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field
from typing import AsyncIterator

from serve_app.config import ModelConfig
from serve_app.generation import (
    ChoiceDelta,
    EngineStats,
    GenerationChunk,
    GenerationError,
    GenerationRequest,
)


@dataclass
class _Seq:
    request: GenerationRequest
    max_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_generated: int = 0


class SimEngine:
    def __init__(self, model: ModelConfig) -> None:
        self._model = model
        self._sim = model.simulation
        self.max_model_len = model.engine.max_model_len or 2048
        self._max_num_seqs = model.engine.max_num_seqs
        self._running: dict[str, _Seq] = {}
        self._waiting: list[tuple[int, int, str]] = []  # (priority, arrival, id) heap
        self._seqs: dict[str, _Seq] = {}
        self._arrivals = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._dead = False

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
                seq.queue.put_nowait((f" tok{seq.num_generated}", "length" if done else None))
                if done:
                    self._finish(rid)

    def _finish(self, rid: str) -> None:
        self._running.pop(rid, None)
        self._seqs.pop(rid, None)

    async def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk | GenerationError]:
        text = request.prompt if request.messages is None else " ".join(
            m["content"] for m in request.messages
        )  # fmt: skip
        num_prompt = max(1, len(text) // 4) if isinstance(text, str) else len(text)
        room = self.max_model_len - num_prompt
        max_tokens = request.max_tokens or min(self._model.max_tokens_default, room)
        if num_prompt >= self.max_model_len or max_tokens > room:
            yield GenerationError(400, f"maximum context length is {self.max_model_len} tokens",
                                  param="max_tokens")  # fmt: skip
            return
        seq = _Seq(request, max_tokens)
        rid = request.request_id
        self._seqs[rid] = seq
        heapq.heappush(self._waiting, (request.priority, next(self._arrivals), rid))
        self._wake.set()
        try:
            while True:
                piece, finish = await seq.queue.get()
                yield GenerationChunk([ChoiceDelta(0, piece, 1, finish)], num_prompt)
                if finish:
                    return
        finally:
            self._finish(rid)  # abort: frees the slot for the next step

    async def abort(self, request_id: str) -> None:
        self._finish(request_id)

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
