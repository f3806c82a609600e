"""The vLLM implementation of the engine seam: one AsyncLLM (V1 engine) per replica.

The only module that imports vllm. It renders chat prompts with the model's own chat template,
checks the prompt against the context window before the engine sees it, streams deltas, and aborts
the engine request whenever the consumer stops reading (client gone, deadline, cancellation).
"""

from __future__ import annotations

import logging
import os
from typing import Any, AsyncIterator

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

from serve_app.config import ModelConfig
from serve_app.generation import (
    ChoiceDelta,
    EngineStats,
    GenerationChunk,
    GenerationError,
    GenerationRequest,
)

logger = logging.getLogger(__name__)


class _LastSchedulerStats(StatLoggerBase):
    """Keeps the engine's latest scheduler report (running, waiting, KV usage) for routing."""

    latest: Any = None

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        pass

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if scheduler_stats is not None:
            type(self).latest = scheduler_stats

    def log_engine_initialized(self) -> None:
        pass


class VLLMEngine:
    def __init__(self, model: ModelConfig, model_path: str) -> None:
        self._model = model
        self._model_path = model_path
        self._engine: AsyncLLM | None = None
        # A subclass per engine so two engines in one process never share their latest stats.
        self._stats_logger = type("_Stats", (_LastSchedulerStats,), {"latest": None})
        self.max_model_len = 0
        self._by_priority = model.engine.scheduling_policy == "priority"

    async def start(self) -> None:
        cfg = self._model.engine
        if cfg.cpu_kv_cache_space_gib is not None:
            # Read by vLLM's CPU worker when it sizes the KV cache; set before the engine starts.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kv_cache_space_gib)
        args = AsyncEngineArgs(
            model=self._model_path,
            served_model_name=[self._model.name],
            disable_log_stats=False,
            **cfg.engine_kwargs(),
        )
        # vLLM's own metrics (running/waiting, KV usage, prefix-cache hits, TTFT, inter-token
        # latency) go out through Ray's metrics pipeline as ray_vllm_*, beside ours.
        self._engine = AsyncLLM.from_engine_args(
            args, stat_loggers=[self._stats_logger, RayPrometheusStatLogger]
        )
        self.max_model_len = self._engine.model_config.max_model_len
        logger.info("engine for %s ready, max_model_len=%d", self._model.name, self.max_model_len)

    def _tokenize(self, request: GenerationRequest) -> list[int]:
        tokenizer = self._engine.get_tokenizer()
        if request.messages is not None:
            text = tokenizer.apply_chat_template(
                request.messages, tokenize=False, add_generation_prompt=True
            )
            return tokenizer.encode(text, add_special_tokens=False)
        if isinstance(request.prompt, list):
            return list(request.prompt)
        return tokenizer.encode(request.prompt or "")

    def _sampling_params(self, request: GenerationRequest, num_prompt_tokens: int) -> SamplingParams:
        room = self.max_model_len - num_prompt_tokens
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = min(self._model.max_tokens_default, room)
        elif max_tokens > room:
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in "
                f"the prompt, {max_tokens} for the completion). Please reduce the length of the "
                "prompt or max_tokens.",
                parameter="max_tokens",
            )
        return SamplingParams(
            **request.sampling, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA
        )

    def _validate(self, request: GenerationRequest) -> tuple[list[int], SamplingParams]:
        try:
            ids = self._tokenize(request)
        except Exception as e:  # chat template errors (bad roles, ...) are the caller's input
            raise VLLMValidationError(f"could not render the prompt: {e}", parameter="messages")
        if not ids:
            raise VLLMValidationError("the prompt is empty", parameter="prompt")
        if len(ids) >= self.max_model_len:
            param = "messages" if request.messages is not None else "prompt"
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your {param} resulted in {len(ids)} tokens. Please reduce the length of the "
                f"{param}.",
                parameter=param,
            )
        try:
            return ids, self._sampling_params(request, len(ids))
        except VLLMValidationError:
            raise
        except (ValueError, TypeError) as e:
            raise VLLMValidationError(str(e)) from e

    async def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk | GenerationError]:
        assert self._engine is not None, "start() first"
        try:
            ids, params = self._validate(request)
        except VLLMValidationError as e:
            yield GenerationError(400, e.args[0], param=e.parameter)
            return
        finished = False
        first = True
        try:
            async for out in self._engine.generate(
                TokensPrompt(prompt_token_ids=ids),
                params,
                request.request_id,
                # vLLM refuses a non-zero priority unless it schedules by priority.
                priority=request.priority if self._by_priority else 0,
                # Joins vLLM's own spans to the request's trace when vLLM exports them.
                trace_headers=request.trace_headers,
            ):
                choices = [
                    ChoiceDelta(
                        index=o.index,
                        text=o.text,
                        num_tokens=len(o.token_ids),
                        finish_reason=o.finish_reason,
                        stop_reason=o.stop_reason,
                    )
                    for o in out.outputs
                ]
                prompt_text = None
                if first and request.echo:
                    prompt_text = self._engine.get_tokenizer().decode(ids)
                first = False
                finished = out.finished
                yield GenerationChunk(choices, len(ids), prompt_text)
        except VLLMValidationError as e:
            # Raised by the engine's own input checks before any output.
            yield GenerationError(400, e.args[0], param=e.parameter)
        finally:
            if not finished:
                # The consumer went away (client disconnect, deadline, cancel): free the KV
                # blocks now rather than when the engine notices.
                await self._engine.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

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
            running, waiting, kv = latest.num_running_reqs, latest.num_waiting_reqs, latest.kv_cache_usage
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            num_unfinished=unfinished,
            kv_cache_usage=kv,
            healthy=not engine.errored,
            extra={"engine_pid": self._engine_pid()},
        )

    def _engine_pid(self) -> int | None:
        # The EngineCore process: what dies in a crash, and what the chaos tests kill.
        manager = getattr(getattr(self._engine.engine_core, "resources", None), "engine_manager",
                          None)  # fmt: skip
        procs = getattr(manager, "processes", None) or []
        return procs[0].pid if procs else None

    async def check_health(self) -> None:
        if self._engine is None:
            raise RuntimeError("engine not started")
        await self._engine.check_health()

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
