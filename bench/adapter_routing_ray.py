"""Ray Serve LLM as the third system of bench/adapter_routing.py: the same two replicas, engine
args and adapter files, its own routing (power of two choices, preferring replicas whose
multiplexed model set holds the adapter), adapters multiplexed from a local S3 stand-in
(bench/s3_standin.py), since Ray Serve LLM loads them only from a cloud URI.

Clients name an adapter `BASE_MODEL:ADAPTER` (`model_id`). A Ray Serve LLM reply does not say
which replica served it, so its loads are read from Ray's own metrics instead of per request:
`serve_multiplexed_models_load_counter`, each time a replica adds an adapter to its multiplexed
set (at most `max_num_adapters_per_replica`, set to `max_cpu_loras`, then the least recently
used is dropped), summed over the replicas (`loads`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.peers import systems
from bench.peers.spec import Model
from bench.s3_standin import S3StandIn, s3_standin

NAME = "ray-serve-llm"
LOAD_COUNTER = "ray_serve_multiplexed_models_load_counter"


def model_id(base: str, adapter: str) -> str:
    """How a Ray Serve LLM client names an adapter of `base` (its lora_utils.get_lora_id)."""
    return f"{base}:{adapter}"


def adapter_folders(app_args: dict[str, Any]) -> dict[str, Path]:
    """The platform's own adapter folders for the bench's first model (`random:SEED` ones are
    built into the model cache, once, as a replica would): the same files both systems load."""
    from llmserve.config.app_config import AppConfig
    from llmserve.planning import adapters, model_source

    app = AppConfig.model_validate(app_args)
    model, cache = app.models[0], app.cache_dir()
    model_dir = model_source.resolve(model, cache)
    return {
        a.name: Path(adapters.adapter_dir(model, a, model_dir, cache)) for a in model.lora.adapters
    }


def counter_sum(metrics_text: str, name: str = LOAD_COUNTER) -> float:
    """The sum of a Prometheus counter's samples over all labels (`name` or `name_total`)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{", 1)[0] in (name, f"{name}_total"):
            total += float(value)
    return total


class RayServeLLMAdapters(systems.RayServeLLM):
    """Ray Serve LLM, `replicas` engine replicas with LoRA on, adapters under `store.uri`."""

    def __init__(
        self, model: Model, port: int, work_dir: Path, config_path: Path, *, lora: dict,
        replicas: int, store: S3StandIn,
    ) -> None:  # fmt: skip
        super().__init__(model, port, work_dir, config_path)
        self._lora, self._replicas, self._store = lora, replicas, store
        self.metrics_port = port + 5  # port+1..+4: HAProxy's and the fallback proxy's

    def spec(self) -> dict[str, Any]:
        return {
            **super().spec(),
            # The platform's engine args plus its LoRA ones (enable_lora, max_loras, ...).
            "engine_args": {**self.model.engine_args, **self._lora_engine_kwargs()},
            "num_replicas": self._replicas,
            "lora_config": {
                "dynamic_lora_loading_path": self._store.uri,
                # What each replica keeps multiplexed: as many as its engine holds in memory.
                "max_num_adapters_per_replica": self._lora["max_cpu_loras"],
            },
            "env": self._store.env,  # the engine replicas download the adapters
        }

    def _lora_engine_kwargs(self) -> dict[str, Any]:
        keys = ("max_loras", "max_lora_rank", "max_cpu_loras")
        return {"enable_lora": True, **{k: self._lora[k] for k in keys}}

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv, env = super().command()
        # The ingress lists the adapters (/v1/models) from the same store: every Ray process
        # gets its endpoint, through the driver's environment.
        return [*argv, "--metrics-export-port", str(self.metrics_port)], {**env, **self._store.env}

    def loads(self, settle_s: float = 3.0, timeout_s: float = 60.0) -> float | None:
        """The replicas' adapter loads so far, once Ray's metrics export stops changing (it
        reports every few seconds); None if it cannot be read."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        last, deadline = None, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                now = counter_sum(httpx.get(url, timeout=10).text)
            except (httpx.HTTPError, ValueError):
                now = None
            if now is not None and now == last:
                return now
            last = now
            time.sleep(settle_s)
        return last


@dataclass(frozen=True)
class Setup:
    model: Model
    app_args: dict[str, Any]  # the platform's, for the adapter folders and LoRA settings
    port: int
    work_dir: Path
    config_path: Path


@contextlib.contextmanager
def started_store(setup: Setup) -> Iterator[RayServeLLMAdapters]:
    """The S3 stand-in holding the adapters, and the system over it (not started yet)."""
    folders = adapter_folders(setup.app_args)
    log = setup.work_dir / "moto.server.log"
    with s3_standin(setup.port + 6, folders, log) as store:
        m = setup.app_args["models"][0]
        yield RayServeLLMAdapters(
            setup.model, setup.port, setup.work_dir, setup.config_path,
            lora=m["lora"], replicas=m["deployment"]["num_replicas"], store=store,
        )  # fmt: skip
