"""Starting a replica of a model scaled to zero without holding a client's request for it.

Ray's autoscaler counts the calls waiting at a deployment's handles (the policy's
`total_num_requests`, llmserve/autoscaling/ray_policy.py); a request the gate refuses for a cold
start (503 `cold_start`) is not one of them. So the gate wakes the model: one cheap call (the
engine's `stats`) waits at the handle until a replica serves it, whoever asked meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("ray.serve")


class Waker:
    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        self._handles = handles
        self._waking: dict[str, asyncio.Task] = {}

    def __call__(self, model: str) -> None:
        if model not in self._waking:
            task = asyncio.get_running_loop().create_task(self._until_up(model))
            self._waking[model] = task
            task.add_done_callback(lambda _: self._waking.pop(model, None))

    async def _until_up(self, model: str) -> None:
        try:
            await self._handles[model].stats.remote()
            logger.info("%s: a replica serves again", model)
        except Exception as e:  # the next refused request wakes it again
            logger.warning("%s: waking it failed: %r", model, e)
