"""The names a client may send as `model`, as the Router knows them: those of the app's args (its
models and their `lora.adapters`, fixed while the app runs) and the adapters each model's
replicas loaded from their deployment's user_config (llmserve/config/lora_config.py,
`RuntimeAdapters`), which change without a restart of anything.

The runtime adapters are asked of a replica of each model with a `lora:` section: every
`REFRESH_S`, and at once for a name not known (or a model list asked for) when the last answer is
older than `FRESH_S`, so that an adapter just added answers on its first request, while a flood
of wrong names costs one call per `FRESH_S`. Callers arriving while a refresh is under way wait
for that one. A replica that does not answer keeps its model's last answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from llmserve.config.app_config import AppConfig, Served
from llmserve.config.host_fit import HeldBack
from llmserve.config.lora_config import AdapterConfig

logger = logging.getLogger("ray.serve")
REFRESH_S = 5.0
FRESH_S = 1.0
ASK_TIMEOUT_S = 2.0

AskReplica = Callable[[str], Awaitable[list[dict]]]  # model name -> its runtime adapters


class ServedTable:
    def __init__(
        self,
        config: AppConfig,
        ask: AskReplica,
        clock=time.monotonic,
        held_back: dict[str, HeldBack] | None = None,
    ) -> None:
        self._fixed = config.served()
        # Names of the app's args that this host cannot serve (llmserve/config/host_fit.py).
        self.held_back = held_back or {}
        self._lora_models = {m.name: m for m in config.models if m.lora is not None}
        self._ask = ask
        self._clock = clock
        self._runtime: dict[str, dict[str, Served]] = {}  # model -> adapter name -> Served
        self._asked_s = float("-inf")
        self._refreshing: asyncio.Task | None = None

    def get(self, name: str) -> Served | None:
        served = self._fixed.get(name)
        if served is not None:
            return served
        for adapters in self._runtime.values():
            if name in adapters:
                return adapters[name]
        return None

    def held_back_for(self, tenant: str) -> dict[str, str]:
        """The held-back names a tenant may use -> why; the others are not its business."""
        return {m: h.reason for m, h in self.held_back.items() if h.told_to(tenant)}

    def held_back_reason(self, name: str, tenant: str) -> str | None:
        """Why this host holds `name` back, where `tenant` may use it; None otherwise."""
        held = self.held_back.get(name)
        return held.reason if held is not None and held.told_to(tenant) else None

    def items(self) -> Iterator[tuple[str, Served]]:
        yield from self._fixed.items()
        for adapters in self._runtime.values():
            yield from adapters.items()

    async def find(self, name: str) -> Served | None:
        """What serves `name`, asking the replicas first if it is not known and the table is
        not fresh."""
        served = self.get(name)
        if served is None and await self.freshen():
            served = self.get(name)
        return served

    async def freshen(self) -> bool:
        """Refreshes the runtime adapters unless asked within `FRESH_S`; whether it did."""
        if not self._lora_models:
            return False
        if self._refreshing is None and self._clock() - self._asked_s < FRESH_S:
            return False
        if self._refreshing is None:
            self._refreshing = asyncio.create_task(self._refresh())
        task = self._refreshing
        try:
            await asyncio.shield(task)  # a caller's cancellation leaves the refresh to others
        finally:
            if task.done() and self._refreshing is task:
                self._refreshing = None
        return True

    async def run(self) -> None:
        """The Router's background loop."""
        while self._lora_models:
            await asyncio.sleep(REFRESH_S)
            await self.freshen()

    async def _refresh(self) -> None:
        self._asked_s = self._clock()
        answers = await asyncio.gather(
            *(self._ask_one(model) for model in self._lora_models), return_exceptions=True
        )
        for model, found in zip(self._lora_models, answers):
            if isinstance(found, BaseException):
                logger.warning("no runtime adapter list from %s's replicas: %r", model, found)
                continue
            self._runtime[model] = {
                a.name: Served(self._lora_models[model], a)
                for a in found
                if a.name not in self._fixed  # another model's name keeps its meaning
            }

    async def _ask_one(self, model: str) -> list[AdapterConfig]:
        found = await asyncio.wait_for(self._ask(model), ASK_TIMEOUT_S)
        return [AdapterConfig.model_validate(d) for d in found]
