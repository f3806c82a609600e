"""The engine seam: the one interface an LLMServer replica drives.

An engine is an OpenAI HTTP server over a generator, in-process: `app` is an ASGI app answering
the paths in `paths`. `VLLMEngine` (vllm_engine.py) is vLLM's own server over one AsyncLLM
and the only module that imports vllm or torch; `SimEngine` (sim_engine.py) simulates
one for relay, policy and load tests. The replica knows neither.

While an engine answers a request it adds what the request used to `request_usage`, the `Usage`
the replica set for that request (a context variable: every task the app starts for the request
sees the same one), so that the Router settles token buckets from counted tokens, not from
parsing replies.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

from llmserve.protocol.replica_call import CachedBlocks, EngineStats, Usage
from llmserve.replica.engine.asgi_call import ASGIApp

request_usage: ContextVar[Usage | None] = ContextVar("request_usage", default=None)


class Engine(Protocol):
    app: ASGIApp
    paths: frozenset[str]  # the forwarded paths this engine serves (vLLM's tasks decide)

    async def start(self) -> None:
        """Load weights and allocate the KV cache. Raises if the engine cannot start."""

    def stats(self) -> EngineStats: ...

    def cached_blocks(self) -> CachedBlocks | None:
        """The blocks its prefix cache holds, or None when it does not say (prefix-aware
        routing then weighs load alone)."""

    async def loaded_adapters(self) -> frozenset[str] | None:
        """The LoRA adapters its engine holds in memory now, by name (a request for another
        loads it first); None for an engine without LoRA."""

    async def load_adapter(self, name: str, path: str) -> None:
        """Registers a LoRA adapter (`path`: its folder) with the running engine under `name`,
        or re-registers it from a new folder; raises ValueError with the engine's words where it
        cannot load it."""

    async def unload_adapter(self, name: str) -> None:
        """Forgets a LoRA adapter registered by `load_adapter`; no-op for an unknown name."""

    async def check_health(self) -> None:
        """Raises when the engine is dead."""

    def shutdown(self) -> None: ...
