"""The command line `vllm serve` would get for a model: engine args and server flags as argv.

One function for both users: the replica parses this argv with vLLM's own parser (so the engine
and its OpenAI server start exactly as `vllm serve` starts them), and the benchmarks and the
parity test start a bare `vllm serve` with the very same argv. Pure: no vllm import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmserve.config.app_config import ModelConfig

# Marks the deploy-time flag check's answer among whatever vllm prints on stdout as it imports
# (llmserve/replica/engine/vllm_engine.py writes it, llmserve/app.py reads it).
FLAG_CHECK_PREFIX = "llmserve-flag-check: "


@dataclass(frozen=True)
class VllmLaunch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def flags(kwargs: dict[str, Any]) -> list[str]:
    """Keyword arguments as vLLM CLI flags: `max_num_seqs=32` -> `--max-num-seqs 32`."""
    argv: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):  # vLLM's booleans take --x / --no-x
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def engine_kwargs(model: ModelConfig, native_bf16: bool) -> dict[str, Any]:
    """The model's engine args for this host. `dtype: auto` is vLLM's (the model's own dtype)
    except on a CPU replica whose CPU lacks native bf16 (`native_bf16`, llmserve/edge/host.py),
    which computes a bf16 model several times slower than float32: there it is float32."""
    kwargs = model.engine.engine_kwargs()
    if kwargs.get("dtype") == "auto" and model.deployment.num_gpus == 0 and not native_bf16:
        kwargs["dtype"] = "float32"
    return kwargs


def launch(
    model: ModelConfig, model_path: str, native_bf16: bool, local_rank: int = 0
) -> VllmLaunch:
    """`native_bf16`: whether the replica's CPU computes bf16 natively (engine_kwargs);
    `local_rank`: the replica's rank among this model's replicas on its node, which picks its
    entry of `engine.cpu_cores_by_replica`."""
    engine = model.engine
    argv = ["--model", model_path, "--served-model-name", model.name]
    argv += flags(engine_kwargs(model, native_bf16))
    argv += flags(model.server.server_kwargs())
    if model.lora is not None:
        # Loaded when the engine starts; vLLM's /v1/models lists each under its base model.
        argv += flags(model.lora.engine_kwargs())
        if model.lora.adapters:  # none: LoRA on, adapters come from the user_config
            argv += ["--lora-modules"] + [
                json.dumps({"name": a.name, "path": a.source, "base_model_name": model.name})
                for a in model.lora.adapters
            ]
    env = {}
    if engine.cpu_kv_cache_space_gib is not None:
        # vLLM's CPU worker sizes its KV cache from this variable instead of
        # gpu_memory_utilization.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kv_cache_space_gib)
    cores = engine.cpu_cores_by_replica
    if cores:
        # More replicas on a node than entries: they share, round robin, rather than fail.
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores[local_rank % len(cores)]
    return VllmLaunch(argv, env)
