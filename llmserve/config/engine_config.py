"""A model's vLLM engine args and `vllm serve` server flags, as the config gives them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from llmserve.config.strict import Strict

ENGINE_ARGS_SET_BY_SERVER = frozenset({"model", "served_model_name", "disable_log_stats"})
ENGINE_ENV_FIELDS = frozenset({"cpu_kv_cache_space_gib", "cpu_cores_by_replica"})  # env, not args
CoreList = Annotated[str, StringConstraints(pattern=r"^\d+(-\d+)?(,\d+(-\d+)?)*$")]  # "0-3,8"


class EngineConfig(Strict):
    """vLLM engine arguments. The common ones are typed; anything else goes in `extra`."""

    dtype: Literal["auto", "bfloat16", "float16", "float32", "half", "float"] = "auto"
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int = Field(default=64, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, gt=0)
    enable_prefix_caching: bool | None = None
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    seed: int | None = 0
    # CPU builds: vLLM sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB), and pins its worker
    # to VLLM_CPU_OMP_THREADS_BIND, by default to the same core in every engine of a host. The
    # replica sets them from these; entry i: the cores of the replica of node-local rank i.
    cpu_kv_cache_space_gib: int | None = Field(default=None, gt=0)
    cpu_cores_by_replica: list[CoreList] | None = Field(default=None, min_length=1)
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Other vllm.AsyncEngineArgs fields, passed as given."
    )

    @field_validator("extra")
    @classmethod
    def _extra_not_typed(cls, v: dict[str, Any]) -> dict[str, Any]:
        # Checked here, not only in engine_kwargs(), so `serve run` fails before any replica
        # starts. The engine adapter passes `model`, `served_model_name` and `disable_log_stats`
        # itself; repeating them would be a TypeError inside the replica.
        clash = set(v) & ((set(cls.model_fields) - {"extra"}) | ENGINE_ARGS_SET_BY_SERVER)
        if clash:
            raise ValueError(f"engine.extra repeats fields {sorted(clash)}; set them directly")
        return v

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for vllm's AsyncEngineArgs (minus `model`)."""
        kwargs = self.model_dump(exclude={"extra", *ENGINE_ENV_FIELDS}, exclude_none=True)
        clash = set(kwargs) & set(self.extra)
        if clash:
            raise ValueError(
                f"engine.extra repeats typed fields {sorted(clash)}; set them directly"
            )
        kwargs.update(self.extra)
        return kwargs


class ServerConfig(Strict):
    """vLLM's OpenAI server flags for this model: what `vllm serve` takes besides engine args.

    Named and `required` tool choice and `"auto"` tool calls need a tool-call parser that fits the
    model's chat template (vLLM's `--tool-call-parser`); reasoning models need a reasoning parser.
    """

    chat_template: str | None = Field(default=None, description="A file or an inline template.")
    response_role: str = "assistant"
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Other `vllm serve` flags, by their argument names."
    )

    @model_validator(mode="after")
    def _auto_tools_need_a_parser(self) -> ServerConfig:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("server.enable_auto_tool_choice needs server.tool_call_parser")
        return self

    def server_kwargs(self) -> dict[str, Any]:
        kwargs = self.model_dump(exclude={"extra"}, exclude_none=True)
        clash = set(kwargs) & set(self.extra)
        if clash:
            raise ValueError(
                f"server.extra repeats typed fields {sorted(clash)}; set them directly"
            )
        return {**kwargs, **self.extra}
