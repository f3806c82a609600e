"""The vLLM implementation of the engine seam: `vllm serve`, in-process, without its socket.

The only module that imports vllm. It parses the model's flags with vLLM's own argument parser
(the argv `vllm serve` would get, from llmserve/replica/vllm_args.py; `python -m` on this module
runs that parser alone, build_app's check before a deploy), starts one AsyncLLM (V1 engine) and
builds vLLM's own FastAPI app and serving state over it (`build_app`, `init_app_state`), so
every request is validated, answered and streamed by vLLM's code: logprobs, structured output,
tool calls and vLLM's extra parameters work as they do against `vllm serve`.

Three things are added around the engine: each request's token counts go to `request_usage` (the
Router settles the tenant's token bucket from them), the engine's scheduler reports are kept
for routing (running, waiting, KV usage), and, for prefix-aware routing, its KV cache events
are read into the set of blocks it holds (kv_events.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import sys
import time
import types
from typing import Any, NoReturn

from starlette.responses import JSONResponse
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.sampling_params import RequestOutputKind
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

from llmserve.config.app_config import ModelConfig
from llmserve.edge import host, platform_cores
from llmserve.policies.prefix_cache import HASH_ALGOS
from llmserve.protocol.replica_call import FORWARDED_PATHS, CachedBlocks, EngineStats
from llmserve.replica import vllm_args
from llmserve.replica.engine import request_usage
from llmserve.replica.engine.kv_events import KVEventSubscriber

logger = logging.getLogger(__name__)


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """vLLM's own parsing of the argv `vllm serve` would get (llmserve/replica/vllm_args.py). A
    flag or value it refuses raises ValueError with argparse's message, where argparse itself
    would print the whole usage of `vllm serve` and exit with code 2."""
    parser = make_arg_parser(FlexibleArgumentParser())

    def refuse(message: str) -> NoReturn:
        raise ValueError(message)

    parser.error = refuse  # type: ignore[method-assign]
    return parser.parse_args(argv)


class _LastSchedulerStats(StatLoggerBase):
    """Keeps the engine's latest scheduler report (running, waiting, KV usage) for routing."""

    latest: Any = None
    prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache, since start
    prefix_cache_hits = 0

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        pass

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if scheduler_stats is not None:
            cls = type(self)
            cls.latest = scheduler_stats
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            if prefix is not None:
                cls.prefix_cache_queries += prefix.queries
                cls.prefix_cache_hits += prefix.hits

    def log_engine_initialized(self) -> None:
        pass


def _count_usage(generate):
    """AsyncLLM.generate, adding each request's tokens to the Usage of the request in context."""

    async def counted(prompt, sampling_params, request_id, *args, **kwargs):
        usage = request_usage.get()
        if usage is None:
            async for out in generate(prompt, sampling_params, request_id, *args, **kwargs):
                yield out
            return
        cumulative = sampling_params.output_kind == RequestOutputKind.CUMULATIVE
        seen: dict[int, int] = {}  # tokens so far per choice
        start = time.monotonic()
        first = True
        async for out in generate(prompt, sampling_params, request_id, *args, **kwargs):
            if first and out.prompt_token_ids is not None:
                usage.num_prompt_tokens += len(out.prompt_token_ids)
            first = False
            for o in out.outputs:
                n = len(o.token_ids)
                new = n - seen.get(o.index, 0) if cumulative else n
                seen[o.index] = n if cumulative else seen.get(o.index, 0) + n
                if new:
                    usage.num_completion_tokens += new
                    now = time.monotonic() - start
                    if usage.first_output_s is None:
                        usage.first_output_s = now
                    usage.last_output_s = now
            yield out

    return counted


class VLLMEngine:
    def __init__(self, model: ModelConfig, model_path: str, local_rank: int = 0) -> None:
        self._model = model
        self._model_path = model_path
        self._local_rank = local_rank  # among the model's replicas on this node
        self._engine: AsyncLLM | None = None
        # A subclass per engine so two engines in one process never share their latest stats.
        self._stats_logger = type("_Stats", (_LastSchedulerStats,), {"latest": None})
        self.app: Any = None
        self.paths: frozenset[str] = frozenset()
        self.max_model_len = 0
        self._kv_events = KVEventSubscriber() if model.routing.prefix_aware else None
        self._block_size = 0
        self._cached: CachedBlocks | None = None

    async def start(self) -> None:
        launch = vllm_args.launch(
            self._model, self._model_path, host.cpu_has_native_bf16(), self._local_rank
        )
        # Read by vLLM's CPU worker when it sizes its KV cache and pins its threads.
        os.environ.update(launch.env)
        argv = launch.argv
        if self._kv_events is not None:
            argv = [*argv, "--kv-events-config", json.dumps(self._kv_events.config())]
        args = parse_serve_args(argv)
        validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        cache = vllm_config.cache_config
        if self._kv_events is not None and not (
            cache.enable_prefix_caching and cache.prefix_caching_hash_algo in HASH_ALGOS
        ):
            logger.warning(
                "%s: prefix-aware routing needs prefix caching with a %s block hash; off",
                self._model.name,
                "/".join(HASH_ALGOS),
            )
            self._kv_events = None
        self._block_size = cache.block_size
        # vLLM's own metrics (running/waiting, KV usage, prefix-cache hits, TTFT, inter-token
        # latency) go out through Ray's metrics pipeline as ray_vllm_*, beside ours.
        # The replica runs on the platform's cores; the engine's processes it starts here
        # inherit all of them, so that vLLM's worker may bind its own
        # (llmserve/edge/platform_cores.py).
        with platform_cores.all_cores():
            self._engine = AsyncLLM.from_vllm_config(
                vllm_config,
                usage_context=UsageContext.OPENAI_API_SERVER,
                stat_loggers=[self._stats_logger, RayPrometheusStatLogger],
                enable_log_requests=engine_args.enable_log_requests,
                disable_log_stats=engine_args.disable_log_stats,
            )
        self._engine.generate = _count_usage(self._engine.generate)
        if self._kv_events is not None:
            self._kv_events.start()
        tasks = await self._engine.get_supported_tasks()
        self.app = build_app(args, tasks, self._engine.model_config)
        await init_app_state(self._engine, self.app.state, args, tasks)
        # vLLM's engine-error handler tells its uvicorn server to stop through state.server;
        # there is none here (the replica's watchdog replaces a dead engine), but the read must
        # succeed, or an AttributeError replaces the engine's error in the answer.
        self.app.state.server = types.SimpleNamespace()
        # What vLLM mounted for this model's tasks (no /v1/embeddings for a generative model).
        mounted = {getattr(r, "path", None) for r in self.app.routes}
        self.paths = frozenset(p for p in FORWARDED_PATHS if p in mounted)
        self.max_model_len = self._engine.model_config.max_model_len
        logger.info(
            "engine for %s ready: tasks %s, max_model_len=%d",
            self._model.name,
            tasks,
            self.max_model_len,
        )

    def stats(self) -> EngineStats:
        engine = self._engine
        if engine is None:
            return EngineStats(0, 0, 0, 0.0, healthy=False)
        unfinished = engine.get_num_unfinished_requests()
        latest = self._stats_logger.latest
        if latest is None or unfinished == 0:
            # The engine core reports only while it steps; once idle its last report is stale.
            # With no request left every KV block is free (cached prefixes count as free).
            running, waiting, kv = 0, 0, 0.0
        else:
            running, waiting = latest.num_running_reqs, latest.num_waiting_reqs
            kv = latest.kv_cache_usage
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            num_unfinished=unfinished,
            kv_cache_usage=kv,
            healthy=not engine.errored,
            extra={
                "engine_pid": self._engine_pid(),
                "prefix_cache_queries": self._stats_logger.prefix_cache_queries,
                "prefix_cache_hits": self._stats_logger.prefix_cache_hits,
            },
        )

    def store_responses(self) -> None:
        """Turns the server's Responses API store on. It keeps what it stores in its own memory
        forever (vLLM's FIXME): the replica moves each stored turn to the app's ResponseStore
        at once and stages a follow-up's back (llmserve/replica/stored_turns.py)."""
        self.app.state.openai_serving_responses.enable_store = True

    def take_stored_response(self, response_id: str) -> tuple[bytes, bytes] | None:
        """What the server stored of a response it answered, out of its memory: the response
        as `GET /v1/responses/{id}` answers it, and the state a follow-up reloads."""
        serving = self.app.state.openai_serving_responses
        response = serving.response_store.pop(response_id, None)
        messages = serving.msg_store.pop(response_id, None)
        if response is None:
            return None
        as_json = JSONResponse(content=response.model_dump(mode="json", by_alias=True)).body
        return bytes(as_json), pickle.dumps((response, messages))

    def stage_stored_response(self, response_id: str, state: bytes | None) -> None:
        """Puts a stored response back where the server reads `previous_response_id`; None
        takes it out (the server then answers its own 404)."""
        serving = self.app.state.openai_serving_responses
        if state is None:
            serving.response_store.pop(response_id, None)
            serving.msg_store.pop(response_id, None)
            return
        response, messages = pickle.loads(state)
        serving.response_store[response_id] = response
        if messages is not None:
            serving.msg_store[response_id] = messages

    def cached_blocks(self) -> CachedBlocks | None:
        if self._kv_events is None:
            return None
        version, keys = self._kv_events.held()
        if self._cached is None or self._cached.version != version:
            # The engine core inherits this process's environment, PYTHONHASHSEED included.
            seed = os.environ.get("PYTHONHASHSEED")
            self._cached = CachedBlocks(version, self._block_size, seed, keys)
        return self._cached

    async def loaded_adapters(self) -> frozenset[str] | None:
        if self._engine is None or self._model.lora is None:
            return None
        # vLLM's serving layer names each adapter it registered (--lora-modules) by its int id;
        # the engine core lists the ids its LRU holds (--max-cpu-loras).
        by_id = {
            r.lora_int_id: name
            for name, r in self.app.state.openai_serving_models.lora_requests.items()
        }
        held = await self._engine.list_loras()
        return frozenset(by_id[i] for i in held if i in by_id)

    async def load_adapter(self, name: str, path: str) -> None:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        models = self.app.state.openai_serving_models
        current = models.lora_requests.get(name)
        if current is not None and current.lora_path == path:
            return  # as registered: reloading it would only warn
        # vLLM's own runtime loading (what its /v1/load_lora_adapter route calls): the engine
        # loads the weights now, so that an adapter that cannot load fails here, not on a request.
        r = await models.load_lora_adapter(
            LoadLoRAAdapterRequest(lora_name=name, lora_path=path, load_inplace=current is not None)
        )
        if isinstance(r, ErrorResponse):
            raise ValueError(f"adapter {name!r} ({path}): {r.error.message}")

    async def unload_adapter(self, name: str) -> None:
        from vllm.entrypoints.serve.lora.protocol import UnloadLoRAAdapterRequest

        models = self.app.state.openai_serving_models
        current = models.lora_requests.get(name)
        if current is None:
            return
        await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))
        # The serving layer forgets the name; the engine would keep its weights until its LRU
        # evicts them. A request already running with it finishes first (vLLM's remove_lora).
        await self._engine.remove_lora(current.lora_int_id)

    def _engine_pid(self) -> int | None:
        # The EngineCore process: what dies in a crash, and what the chaos tests kill.
        manager = getattr(
            getattr(self._engine.engine_core, "resources", None), "engine_manager", None
        )
        procs = getattr(manager, "processes", None) or []
        return procs[0].pid if procs else None

    async def check_health(self) -> None:
        if self._engine is None:
            raise RuntimeError("engine not started")
        await self._engine.check_health()

    def shutdown(self) -> None:
        if self._kv_events is not None:
            self._kv_events.stop()
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def _check_flags() -> None:
    """`python -m llmserve.replica.engine.vllm_engine`: argv lists (JSON on stdin) through vLLM's
    parser; one line out, the prefix then each one's error (or null), as JSON. build_app runs it
    in a subprocess (llmserve/app.py), so that the driver itself never loads vllm or torch."""
    errors = []
    for argv in json.load(sys.stdin):
        try:
            parse_serve_args(argv)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    print(vllm_args.FLAG_CHECK_PREFIX + json.dumps(errors), flush=True)


if __name__ == "__main__":
    _check_flags()
