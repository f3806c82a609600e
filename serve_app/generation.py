"""Plain data that crosses the Router -> LLMServer -> engine boundary.

These are what a DeploymentHandle caller sends to an LLMServer and gets back, so they stay small,
picklable and free of vLLM types. The engine adapter turns them into vLLM's own objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    # Exactly one of `prompt` (completions) and `messages` (chat) is set.
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    # vllm.SamplingParams keyword arguments (temperature, top_p, stop, seed, n, ...), already
    # validated by the protocol layer. `max_tokens` is kept apart: None means the model default.
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    priority: int = 0  # lower runs first, as in vLLM's priority scheduling
    echo: bool = False
    trace_headers: dict[str, str] | None = None  # W3C trace context of the caller's span
    # On a retry: the replica that refused the first attempt, which the request router skips.
    avoid_replica_id: str | None = None


@dataclass(frozen=True)
class ChoiceDelta:
    index: int
    text: str  # new text since the previous delta of this choice
    num_tokens: int  # new tokens since the previous delta of this choice
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    stop_reason: str | int | None = None


@dataclass(frozen=True)
class GenerationChunk:
    """One step of a generation stream: deltas of one or more choices."""

    choices: list[ChoiceDelta]
    num_prompt_tokens: int
    prompt_text: str | None = None  # set on the first chunk when `echo` was asked
    replica_id: str | None = None  # set on the first chunk by the replica that serves it


@dataclass(frozen=True)
class GenerationError:
    """An error the engine reports instead of output (bad prompt, too long, engine dead).

    Sent as a stream item rather than raised so that it reaches the caller with its HTTP status
    intact instead of wrapped in a RayTaskError.
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    replica_id: str | None = None  # set by a replica that refuses the request (unhealthy)


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_unfinished: int  # requests the engine still tracks (running + waiting + finishing)
    kv_cache_usage: float  # 0..1, from the engine's last scheduler report
    healthy: bool
    extra: dict[str, Any] = field(default_factory=dict)
