"""vLLM's priority scheduling through our engine adapter: under KV pressure the engine preempts
the lowest-priority running request, so an interactive request that arrived last is not the one
sacrificed, as it is under FCFS. Same scenario, both policies, one engine at a time (no Ray).
(vLLM preempts for KV blocks, not for a free slot: with every slot taken, a waiting interactive
request waits for the next one to free, first in line.)"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from llmserve.config.app_config import EngineConfig, ModelConfig
from llmserve.protocol.replica_call import COMPLETIONS_PATH, ReplicaRequest
from llmserve.replica.engine.asgi_call import AsgiCall
from llmserve.replica.engine.vllm_engine import VLLMEngine
from tests.integration.apps import TINY

NUM_BATCH = 3
MAX_TOKENS = 400


async def _scenario(model_dir, policy: str) -> dict[str, float]:
    model = ModelConfig(
        name=TINY,
        source=str(model_dir),
        engine=EngineConfig(
            dtype="auto",
            enforce_eager=True,
            max_model_len=512,
            max_num_seqs=4,
            scheduling_policy=policy,
            cpu_kv_cache_space_gib=1,
            # Room for fewer than 2 of the 4 sequences at full length: KV runs short mid-way.
            extra={"num_gpu_blocks_override": 24, "block_size": 32},
        ),
    )
    engine = VLLMEngine(model, str(model_dir))
    await engine.start()
    finished: dict[str, float] = {}
    t0 = time.monotonic()

    async def run(rid: str, priority: int) -> None:
        # The priority goes in the body, as the Router puts the tenant's there (vLLM refuses
        # one but 0 unless it schedules by priority).
        body = {
            "model": TINY,
            "prompt": "Once upon a time",
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "priority": priority if policy == "priority" else 0,
        }
        call = AsgiCall(
            engine.app,
            ReplicaRequest(
                rid,
                COMPLETIONS_PATH,
                json.dumps(body).encode(),
                (("content-type", "application/json"),),
            ),
        )
        await call.ended.wait()
        assert call.status == 200, call.take()
        await call.close()
        finished[rid] = time.monotonic() - t0

    try:
        tasks = [asyncio.create_task(run(f"batch-{i}", 2)) for i in range(NUM_BATCH)]
        await asyncio.sleep(0.2)  # the batch work is running before the interactive arrives
        tasks.append(asyncio.create_task(run("interactive", 0)))
        await asyncio.gather(*tasks)
    finally:
        engine.shutdown()
    return finished


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_scheduling_protects_the_interactive_request(model_dirs, policy):
    finished = asyncio.run(_scenario(model_dirs[TINY], policy))
    order = sorted(finished, key=finished.get)
    print(f"\n{policy}: finish order {order} at {', '.join(f'{finished[r]:.1f} s' for r in order)}")
    if policy == "priority":
        # Only the batch request that started first may finish before it: the others were the
        # ones preempted when KV ran short.
        assert order.index("interactive") <= 1, "the interactive request was preempted"
    else:
        # The control: FCFS preempts the newest request, so the interactive one finishes last.
        assert order[-1] == "interactive"
