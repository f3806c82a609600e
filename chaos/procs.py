"""The processes of our own cluster by role, and their resident memory.

Ray names its worker processes after the actor they host (`ray::ServeReplica:APP:DEPLOYMENT`,
`ray::ProxyActor`); a vLLM engine core runs as `VLLM::EngineCore` below its replica. Only
processes below this one are looked at, so another Ray instance on the machine is never touched.
"""

from __future__ import annotations

import psutil

MB = 1024 * 1024


def _title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def replica_of(title: str, app: str) -> str | None:
    """The deployment a replica process serves, from its title: `ray::ServeReplica:APP:DEP`,
    followed by `.method` while it runs one (our deployment names hold no such suffix)."""
    head = title.split(" ", 1)[0]
    prefix = f"ray::ServeReplica:{app}:"
    if not head.startswith(prefix):
        return None
    deployment = head[len(prefix) :]
    base, _, method = deployment.rpartition(".")
    return base if base and method.isidentifier() else deployment


def serve_processes(app: str) -> dict[str, psutil.Process]:
    """Role -> process: "proxy", "controller", "<deployment>[pid]" for each replica, and
    "<deployment>[pid]/EngineCore" (and any other vLLM process) below a replica."""
    found: dict[str, psutil.Process] = {}
    for p in psutil.Process().children(recursive=True):
        title = _title(p)
        if title.startswith("ray::ProxyActor"):
            found["proxy"] = p
        elif title.startswith("ray::ServeController"):
            found["controller"] = p
        elif (deployment := replica_of(title, app)) is not None:
            found[f"{deployment}[{p.pid}]"] = p
            for child in p.children(recursive=True):
                if _title(child).startswith("VLLM::"):
                    name = _title(child).split()[0].removeprefix("VLLM::")
                    found[f"{deployment}[{p.pid}]/{name}[{child.pid}]"] = child
    return found


def add_engine(procs: dict[str, psutil.Process], engine_pid: int) -> str | None:
    """Name the engine process a replica reported (`stats().extra["engine_pid"]`) under that
    replica's role, its worker processes (the engine's children) beside it, and return the
    engine's role. Titles alone are not enough: in one CI run in a dozen vLLM's `setproctitle`
    left the engine titled `python -c from multiprocessing...`."""
    for role, p in list(procs.items()):
        if not role.endswith("]"):
            continue
        try:
            if engine_pid not in {c.pid for c in p.children(recursive=True)}:
                continue
            engine = psutil.Process(engine_pid)
            known = {q.pid for q in procs.values()}
            for worker in engine.children():
                if worker.pid not in known:
                    procs[f"{role}/Worker[{worker.pid}]"] = worker
        except psutil.NoSuchProcess:
            continue
        procs[f"{role}/EngineCore[{engine_pid}]"] = engine
        return f"{role}/EngineCore[{engine_pid}]"
    return None


def rss_mb(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for role, p in procs.items():
        try:
            out[role] = round(p.memory_info().rss / MB, 1)
        except psutil.NoSuchProcess:
            pass
    return out


def replicas_below(pid: int, app: str, deployment: str) -> list[int]:
    """Pids of `deployment`'s replica processes below process `pid` (a node's raylet)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p.pid for p in children if replica_of(_title(p), app) == deployment]
