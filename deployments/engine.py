"""The engine seam: the one interface an LLMServer replica drives.

`VLLMEngine` (deployments/vllm_engine.py) is the real implementation and the only module that
imports vllm or torch. Anything else that satisfies this protocol (a simulated engine for load and
policy tests) can stand in without the replica knowing.
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from serve_app.generation import EngineStats, GenerationChunk, GenerationError, GenerationRequest


class Engine(Protocol):
    async def start(self) -> None:
        """Load weights and allocate the KV cache. Raises if the engine cannot start."""

    def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk | GenerationError]:
        """Stream the request's output. Closing the iterator early aborts the request."""

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks. Unknown ids are ignored."""

    def stats(self) -> EngineStats: ...

    async def check_health(self) -> None:
        """Raises when the engine is dead."""

    def shutdown(self) -> None: ...
