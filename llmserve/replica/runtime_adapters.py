"""The LoRA adapters a replica's engine took from its deployment's user_config while running
(llmserve/config/lora_config.py, `RuntimeAdapters`): Serve hands the user_config to the replica
when it starts and on every change of it, without a restart; each change is applied to the engine
here (vLLM's runtime adapter loading).

A user_config that cannot apply is logged and leaves the replica serving what it had: raising
would make Serve replace the replica (its engine restarted), and its successor would fail the
same way. An adapter that cannot load is left out (the replica's log says why, `failed` keeps
it), the others load; the Router answers its name with the 404 of an unknown model.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmserve.config.app_config import ModelConfig
from llmserve.config.lora_config import AdapterConfig, RuntimeAdapters
from llmserve.planning import adapters
from llmserve.replica.engine import Engine

logger = logging.getLogger("ray.serve")


class RuntimeAdapterSet:
    def __init__(self, engine: Engine, model: ModelConfig, model_dir: str, cache: Path) -> None:
        self._engine, self._model, self._model_dir, self._cache = engine, model, model_dir, cache
        self.loaded: dict[str, AdapterConfig] = {}  # as the user_config gave them
        self.failed: dict[str, str] = {}  # adapter name (or "user_config") -> why
        self._lock = asyncio.Lock()  # one change at a time, in the order Serve sent them

    async def apply(self, user_config: dict[str, Any] | None) -> None:
        async with self._lock:
            try:
                wanted = RuntimeAdapters.model_validate(user_config or {}).checked_for(self._model)
            except (ValidationError, ValueError) as e:
                self.failed = {"user_config": str(e)}
                logger.error("user_config of %s not applied: %s", self._model.name, e)
                return
            self.failed = {}
            by_name = {a.name: a for a in wanted.adapters}
            for name in [n for n in self.loaded if n not in by_name]:
                await self._engine.unload_adapter(name)
                del self.loaded[name]
                logger.info("adapter %s of %s unloaded", name, self._model.name)
            for a in wanted.adapters:
                if self.loaded.get(a.name) == a:
                    continue
                try:
                    folder = await asyncio.to_thread(
                        adapters.adapter_dir, self._model, a, self._model_dir, self._cache
                    )
                    await self._engine.load_adapter(a.name, folder)
                except (OSError, ValueError) as e:
                    self.failed[a.name] = str(e)
                    logger.error("adapter %s of %s not loaded: %s", a.name, self._model.name, e)
                    continue
                self.loaded[a.name] = a
                logger.info("adapter %s of %s loaded from %s", a.name, self._model.name, folder)

    def names(self) -> tuple[str, ...] | None:
        """For the routing stats: the request router sends a runtime adapter's requests only to
        replicas that registered it (None: none registered)."""
        return tuple(sorted(self.loaded)) or None

    def listed(self) -> list[dict[str, Any]]:
        """For the Router's table of served names (llmserve/router/served_table.py)."""
        return [a.model_dump() for a in self.loaded.values()]
