"""The platform's apps on a Ray instance of this process's own, with Serve on one loopback port:
the benchmarks' drivers and the integration tests' session cluster start Ray this one way.

    with private_ray(18500, num_cpus=8) as ray_app:
        ray_app.deploy(app_args, name="bench", route_prefix="/")  # llmserve.app:build_app
        httpx.get(f"{ray_app.url}/v1/models")

In order:
1. the platform's Ray environment (llmserve/edge/ray_env.py: token auth, loopback only, Serve's
   throughput-optimized mode behind HAProxy), HAProxy's and the fallback proxy's fixed ports
   on port+1 .. port+4, then the caller's `env` over it. Before this process imports Ray,
   which reads its token mode once, at import: a process that imported Ray earlier must have
   applied it then (tests/conftest.py does), and applying it again changes nothing;
2. `ray.init` with `num_cpus` logical CPUs (more than the cores, or replicas never schedule
   on a 2-core host), no dashboard, no log forwarding; `new_instance` starts a Ray of its own
   even beside another on this machine, and `temp_dir` keeps its session and sockets apart;
3. `serve.start` on 127.0.0.1:port;
4. on the way out, however the block ends: serve.shutdown(), ray.shutdown(), with `reap`
   an end to any process of ours that outlived them (see `reap`), then the cluster's HAProxy
   and shield files (`ray_env.remove_cluster_files(port + 1)`, the run dir its environment
   named).

Not on it: chaos/cluster.py, a cluster of several nodes (`ray.cluster_utils.Cluster`) that
scenarios add and remove under load, whose driver joins by address, whose Ray ports come from a
block held under a file lock, and whose teardown reports every process it had to kill as a
figure of the run; bench/relay_load.py and bench/peers/ start no Ray (their systems run in a
driver that does: bench/relay_cost.py's child, bench/peers/serve_driver.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class PrivateRay:
    url: str  # Serve's HTTP address, http://127.0.0.1:port

    def deploy(self, app_args: dict[str, Any], name: str, route_prefix: str = "/") -> None:
        """`serve.run(build_app(app_args))`: returns once the app's replicas run."""
        from ray import serve

        from llmserve.app import build_app

        serve.run(build_app(app_args), name=name, route_prefix=route_prefix)


@contextlib.contextmanager
def private_ray(
    port: int,
    *,
    num_cpus: int = 8,
    platform_env: bool = True,
    confine_platform: bool = False,
    env: dict[str, str] | None = None,
    new_instance: bool = False,
    temp_dir: str | None = None,
    metrics_export_port: int | None = None,
    system_config: dict[str, Any] | None = None,
    interrupt: Callable[[int, FrameType | None], Any] | None = None,
    reap_leftovers: bool = False,
) -> Iterator[PrivateRay]:
    """`interrupt`: the SIGTERM and SIGINT handler to put back after ray.init, which installs
    its own for SIGTERM. `platform_env=False`: Ray's and Serve's defaults (bench.relay_cost's
    runs of an older tree that has no llmserve/edge/ray_env.py, or of Serve's defaults).
    `confine_platform`: Ray's processes on the platform's cores, as `make serve` starts them
    (llmserve/edge/platform_cores.py); this process goes there too."""
    if platform_env:
        from llmserve.edge import ray_env

        ray_env.apply(port + 1)
    if confine_platform:
        from llmserve.edge import platform_cores

        platform_cores.confine_this_process()
    os.environ.update(env or {})
    import ray
    from ray import serve

    options: dict[str, Any] = {}
    if new_instance:
        options["address"] = "local"
    if temp_dir is not None:
        options["_temp_dir"] = temp_dir
    if metrics_export_port is not None:
        options["_metrics_export_port"] = metrics_export_port
    if system_config is not None:
        options["_system_config"] = system_config
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, **options)
    if interrupt is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, interrupt)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield PrivateRay(f"http://127.0.0.1:{port}")
    finally:
        # Every process below this one, seen before and after Serve stops (the replicas it
        # ends, and any that Ray starts meanwhile).
        tree = _tree() if reap_leftovers else []
        try:
            serve.shutdown()
        finally:
            tree += _tree() if reap_leftovers else []
            try:
                ray.shutdown()
                reap(tree)
            finally:
                if platform_env:
                    from llmserve.edge import ray_env

                    ray_env.remove_cluster_files(port + 1)


def _tree() -> list:
    import psutil

    return psutil.Process().children(recursive=True)


def reap(procs: list, grace_s: float = 5.0) -> None:
    """Ends what outlived ray.shutdown(). Ray's dashboard and runtime-env agents notice that
    their raylet is gone, then may hang for a long time trying to report it to the GCS, which is
    gone too; they have nothing left to do."""
    if not procs:
        return
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if alive:
        print(
            "ending processes that outlived ray.shutdown(): "
            + ", ".join(f"{p.pid}:{_name(p)}" for p in alive),
            flush=True,
        )
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _name(p) -> str:
    import psutil

    try:
        return p.name()
    except psutil.NoSuchProcess:
        return "?"
