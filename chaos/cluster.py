"""A private Ray cluster for one chaos scenario, started and ended by this process.

Ray's own multi-node test support (`ray.cluster_utils.Cluster`) runs every "node" as a set of
processes on this machine, so a scenario can remove a node (kill its raylet and workers) and add
it back. Everything is kept apart from any other Ray instance on the machine:
- RAY_TMPDIR points at a directory of our own, so that our session, our `session_latest` link and
  Ray's `ray_current_cluster` file (which a bare `ray.init()` elsewhere would follow) stay there;
- the driver connects by explicit address, never by auto-detection;
- the ports Ray would otherwise take at fixed defaults (GCS, dashboard agent, metrics export) and
  Serve's HTTP port come from a block of ten in 19300-19399, held under a file lock and checked
  free first (a second run of the suite on the host takes another block; a GCS port taken by
  another cluster would make our head node join that cluster); the rest are picked by the OS;
- HAProxy's files and the shield's go to a run dir of this block (llmserve/edge/ray_env.py), removed
  at the teardown.
Every process this one starts is remembered (with its start time, against pid reuse) so that the
teardown can prove nothing is left running, and end what is.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import socket
import time
from typing import IO, Any

import psutil

from llmserve.edge import ray_env

logger = logging.getLogger("chaos")
RUN_ROOT = "/tmp/lsc"  # short: Ray's unix socket paths must stay under 107 characters
PORTS, BLOCK = range(19300, 19400), 10
LOCK_DIR = "/tmp/llmserve-chaos-ports"


def reserve_ports(preferred: int) -> tuple[int, IO]:
    """The first port of a block of ten that is ours while the returned file stays open."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    bases = list(range(PORTS.start, PORTS.stop, BLOCK))
    first = bases.index(preferred) if preferred in bases else 0
    for base in bases[first:] + bases[:first]:
        lock = open(os.path.join(LOCK_DIR, f"{base}.lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another chaos run holds this block
            lock.close()
            continue
        if all(_port_free(p) for p in range(base, base + BLOCK)):
            return base, lock
        lock.close()
    raise RuntimeError(f"no free block of {BLOCK} ports in {PORTS.start}-{PORTS.stop - 1}")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


class ChaosCluster:
    """`with ChaosCluster(port_base=19310) as c:` a head node, Serve on c.http_port.
    `port_base` is the preferred block; another free one is taken if it is in use."""

    def __init__(
        self,
        port_base: int,
        head_cpus: float = 8,
        head_resources: dict[str, float] | None = None,
        system_config: dict[str, Any] | None = None,
    ) -> None:
        port_base, self._port_lock = reserve_ports(port_base)
        self.port_base = port_base
        self.http_port = port_base
        self.url = f"http://127.0.0.1:{self.http_port}"
        self._head_args = {
            "num_cpus": head_cpus,
            "resources": head_resources or {},
            "include_dashboard": False,
            "gcs_server_port": port_base + 1,
            "dashboard_agent_listen_port": port_base + 2,
            "metrics_export_port": port_base + 3,
            "object_store_memory": 200 * 1024**2,
            "_system_config": system_config or {},
        }
        self._next_port = port_base + 4  # then +9: ray_env takes +5 .. +8
        self.tmp_dir = f"{RUN_ROOT}-{os.getpid()}"
        self.cluster = None
        self._seen: dict[int, float] = {}  # pid -> create_time of every process we started
        self.leftover: list[str] = []

    def __enter__(self) -> ChaosCluster:
        try:
            self.start()
        except BaseException:
            self.track()
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        os.makedirs(self.tmp_dir, exist_ok=True)
        os.environ["RAY_TMPDIR"] = self.tmp_dir  # read when the head node is created
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        # The platform's Ray environment (llmserve/edge/ray_env.py, applied when this process
        # started: chaos/__main__.py), with its fixed ports in this block and HAProxy's files in
        # a run dir of the block's.
        os.environ.update(ray_env.port_env(self.port_base + 5))
        os.environ.update(ray_env.path_env(self.port_base + 5))
        import ray
        from ray import serve
        from ray.cluster_utils import Cluster

        self.cluster = self._start_node(
            lambda: Cluster(initialize_head=True, head_node_args=self._head_args)
        )
        ray.init(address=self.cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        # One proxy, on the head: a second node's proxy would want the same port on this host,
        # and the node-loss scenario must not take the Routers down with the node.
        serve.start(
            proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": self.http_port}
        )
        self.track()

    def add_worker(self, num_cpus: float, resources: dict[str, float]):
        return self._start_node(
            lambda: self.cluster.add_node(
                num_cpus=num_cpus, resources=resources, metrics_export_port=self._take_port()
            )
        )

    def _start_node(self, start, attempts: int = 3):
        """Ray gives a new raylet 30 s to register with the GCS, which busy shared cores can
        miss: then end what the failed start left running and try again."""
        for attempt in range(1, attempts + 1):
            before = set(self._children())
            try:
                result = start()
                self.track()
                return result
            except Exception as e:
                if "timed out during startup" not in str(e) or attempt == attempts:
                    raise
                logger.warning("node start failed (attempt %d): %s", attempt, e)
                for pid in set(self._children()) - before - self._head_tree():
                    self._kill(pid)

    def _head_tree(self) -> set[int]:
        """The head raylet and its workers: never part of another node's failed start."""
        head = self.cluster.head_node if self.cluster is not None else None
        if head is None:
            return set()
        raylet = psutil.Process(head.all_processes["raylet"][0].process.pid)
        return {raylet.pid} | {p.pid for p in raylet.children(recursive=True)}

    def _children(self) -> dict[int, float]:
        out = {}
        for p in psutil.Process().children(recursive=True):
            try:
                out[p.pid] = p.create_time()
            except psutil.NoSuchProcess:
                pass
        return out

    def remove_worker(self, node, graceful: bool = False) -> None:
        """Kills the node's raylet, object store and workers: a machine lost, not drained."""
        self.track()
        self.cluster.remove_node(node, allow_graceful=graceful)

    def _take_port(self) -> int:
        port = self._next_port
        self._next_port = port + 1 if port + 1 < self.port_base + 5 else self.port_base + 9
        return port

    # ----------------------------------------------------------------------------- processes

    def track(self) -> None:
        """Remembers every process below this one (raylets, workers, vLLM engines)."""
        for pid, created in self._children().items():
            self._seen.setdefault(pid, created)

    def owns(self, pid: int) -> bool:
        """True if `pid` is a live process this cluster started (a guard before any kill)."""
        self.track()
        try:
            return self._seen.get(pid) == psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return False

    def alive(self) -> list[psutil.Process]:
        procs = []
        for pid, created in self._seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.NoSuchProcess:
                pass
        return procs

    def _end_alive(self) -> list[str]:
        return [ended for p in self.alive() if (ended := self._kill(p.pid))]

    def _kill(self, pid: int) -> str | None:
        """SIGKILL to one of our processes; says what it was."""
        try:
            p = psutil.Process(pid)
            what = f"{pid} {' '.join(p.cmdline())[:80]}"
            p.send_signal(signal.SIGKILL)
            return what
        except psutil.NoSuchProcess:
            return None

    def close(self) -> None:
        import ray
        from ray import serve

        self.track()
        if ray.is_initialized():
            try:
                serve.shutdown()  # replicas stop gracefully: engines shut down their processes
            except Exception as e:
                logger.warning("serve.shutdown failed: %r", e)
            self.track()
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        deadline = time.monotonic() + 20
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        # Anything still here outlived its cluster: say so, then end it (it is ours).
        self.leftover = self._end_alive()
        if os.environ.get("CHAOS_KEEP_LOGS"):
            print(f"Ray logs of this run: {self.tmp_dir}/ray/session_latest/logs")
            print(f"HAProxy's files of this run: {ray_env.run_dir(self.port_base + 5)}")
        else:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            ray_env.remove_cluster_files(self.port_base + 5)
        self._port_lock.close()  # the ports are free again
