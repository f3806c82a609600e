"""One Ray-based system in its own process: a private Ray instance, Serve on one port, one app.

    python -m bench.peers.serve_driver --system llmserve --port 18510 --spec spec.json \
        --ray-temp-dir /tmp/llmserve-peers-18510

The harness runs every system in a child process, so that nothing here meets a Ray instance the
calling process may hold (pytest's integration session starts one in-process), and so that
stopping a system is stopping a process tree. `address="local"` starts a new Ray instance even
when another one runs on this machine; its own temp dir keeps `session_latest` and socket names
apart from other users' clusters (bench/private_ray.py starts it). SIGTERM or SIGINT:
serve.shutdown(), then ray.shutdown(), which ends the raylet, the GCS and every worker this Ray
instance started, then an end to any of its processes that outlived that
(`bench.private_ray.reap`).
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path
from typing import Any

from bench.private_ray import private_ray

RAY_NUM_CPUS = 8  # logical: replicas must schedule on a 2-core machine (see DESIGN.md)


def platform_app(spec: dict[str, Any]):
    from llmserve.app import build_app

    return build_app(spec["app_args"])


def ray_serve_llm_app(spec: dict[str, Any]):
    """Ray Serve LLM's own OpenAI app over the same model and engine args. Optional in `spec`:
    `num_replicas` (1), `lora_config` (LLMConfig's: adapters multiplexed from a cloud URI) and
    `env` for the engine replicas (bench/adapter_routing_ray.py: its S3 stand-in's endpoint)."""
    from ray.serve.llm import LLMConfig, build_openai_app

    one_replica = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    n = spec.get("num_replicas", 1)
    replicas = {"autoscaling_config": {"min_replicas": n, "max_replicas": n}}
    env = dict(spec.get("env", {}))
    if spec.get("kv_cache_space_gib"):
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec["kv_cache_space_gib"])
    config = LLMConfig(
        model_loading_config={"model_id": spec["model_name"], "model_source": spec["model_path"]},
        engine_kwargs=spec["engine_args"],
        deployment_config=replicas,
        # Without this the engine's placement group asks for a GPU and the replica never starts.
        placement_group_config={"bundles": [{"CPU": 1}]},
        runtime_env={"env_vars": env},
        lora_config=spec.get("lora_config"),
    )
    # One ingress replica, as this platform has one Router replica (Ray Serve LLM's default
    # would autoscale its ingress).
    return build_openai_app({"llm_configs": [config], "ingress_deployment_config": one_replica})


def _interrupt(signum, frame) -> None:
    # Unwind from wherever the main thread is (even mid-deploy) into the shutdown below, and
    # ignore further signals so that a second one cannot cut the shutdown short.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


APPS = {"llmserve": platform_app, "ray-serve-llm": ray_serve_llm_app}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system", choices=sorted(APPS), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--spec", type=Path, required=True, help="JSON written by systems.py")
    p.add_argument("--ray-temp-dir", required=True)
    p.add_argument("--metrics-export-port", type=int, help="Ray's Prometheus export, if wanted")
    args = p.parse_args()
    spec = json.loads(args.spec.read_text())

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)

    t0 = time.monotonic()
    try:
        with private_ray(
            args.port,
            num_cpus=RAY_NUM_CPUS,
            platform_env=args.system == "llmserve",  # llmserve/edge/ray_env.py: the platform's only
            confine_platform=args.system == "llmserve",  # as `make serve` starts it
            new_instance=True,
            temp_dir=args.ray_temp_dir,
            metrics_export_port=args.metrics_export_port,
            # ray.init installs a SIGTERM handler that logs and kills the process on the spot,
            # which would skip serve.shutdown(); ours again.
            interrupt=_interrupt,
            reap_leftovers=True,
        ):
            from ray import serve

            try:
                serve.run(APPS[args.system](spec), name=args.system, route_prefix="/")
                took_s = time.monotonic() - t0
                print(f"serve_driver: {args.system} deployed in {took_s:.1f} s", flush=True)
                while True:
                    time.sleep(1)
            finally:
                print("serve_driver: shutting down", flush=True)
    except KeyboardInterrupt:
        pass
    print("serve_driver: stopped", flush=True)


if __name__ == "__main__":
    main()
