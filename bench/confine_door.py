"""Confine everything of a benchmarked Ray-based system but its vLLM engine to one core.

An experiment, not a feature (README "Where it falls short"): run it beside
`python -m bench.peers --full --scenarios sweep --systems vllm llmserve --config C`, where C is
serve_config.yaml with `deployment.env_vars: {VLLM_CPU_OMP_THREADS_BIND: "0"}` for the default
model. Twice a second, every thread of every process under a bench serve_driver (Ray's GCS,
raylet and agents, Serve's proxy and controller, the Router, the replica actors) is allowed
`--door-cpu` only, except the processes an LLMServer replica started: vLLM's engine core and
worker, whose worker binds its compute thread to the CPU the variable names. Stops when the
file named by `--stop-file` exists.
"""

from __future__ import annotations

import argparse
import os
import time

import psutil

from chaos.procs import replica_of


def confine(door_cpu: int) -> None:
    for driver in psutil.process_iter(["cmdline"]):
        try:
            if "bench.peers.serve_driver" not in " ".join(driver.info["cmdline"] or []):
                continue
            argv = driver.info["cmdline"]
            app = argv[argv.index("--system") + 1]  # serve_driver names the app after it
            tree = [driver, *driver.children(recursive=True)]
            # The engine processes inherit the replica's CPU set when they start; the worker
            # then binds itself to VLLM_CPU_OMP_THREADS_BIND, which this loop must not undo.
            engine = {child.pid for p in tree if _is_llm_replica(p, app)
                      for child in p.children(recursive=True)}  # fmt: skip
            for p in tree:
                if p.pid not in engine:
                    for tid in os.listdir(f"/proc/{p.pid}/task"):
                        try:
                            os.sched_setaffinity(int(tid), {door_cpu})
                        except OSError:  # the thread ended: nothing left to confine
                            continue
        except (psutil.Error, OSError):  # the process ended mid-walk: the next pass sees the rest
            continue


def _is_llm_replica(p: psutil.Process, app: str) -> bool:
    # Our LLMServer deployments are named llm-<model>; Ray Serve LLM's are not confined.
    return (replica_of(" ".join(p.cmdline()), app) or "").startswith("llm-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--door-cpu", type=int, default=1)
    ap.add_argument("--stop-file", default="/tmp/confine_door.stop")
    args = ap.parse_args()
    while not os.path.exists(args.stop_file):
        confine(args.door_cpu)
        time.sleep(0.5)


if __name__ == "__main__":
    main()
