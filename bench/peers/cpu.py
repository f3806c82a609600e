"""Where each system's CPU goes: CPU seconds of its processes by role, read before and after a
load so that the sweep can say how many ms of CPU each role spent per output token.

On this machine the engine computes on the same cores as everything else, so a system's
throughput is what its other processes leave to the engine: these figures say which of them
take it. Roles, from each process's title or command line:
- `engine`: vLLM's engine core and its workers (the model's compute, the same in every system);
- `frontend`: the process holding the AsyncLLM and vLLM's OpenAI layer (bare vLLM's API server,
  the LLMServer replica of llmserve or of Ray Serve LLM);
- `router`: the ingress deployment between the proxy and the frontend (llmserve's Router, Ray
  Serve LLM's OpenAI ingress);
- `proxy`: HAProxy or Serve's proxy actor;
- `ray`: every other process of the tree (GCS, raylet, dashboard and agents, Serve's controller);
- `client`: the load generator (this process: vLLM's benchmark client runs in it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import psutil

ROLES = ("engine", "frontend", "router", "proxy", "ray", "client")


def role(title: str) -> str:
    """The role of a process from its title (Ray and vLLM retitle theirs) or command line."""
    head = title.split(" -", 1)[0]
    if "vllm.entrypoints.openai.api_server" in title or title.startswith("VLLM::APIServer"):
        return "frontend"
    if title.startswith("VLLM::") or "EngineCore" in head:
        return "engine"
    if title.startswith("ray::ProxyActor") or os.path.basename(head.split(" ")[0]) == "haproxy":
        return "proxy"
    if title.startswith("ray::ServeReplica:"):
        parts = head.split(" ")[0].split(":")  # ray::ServeReplica:<app>:<deployment>[:...]
        deployment = parts[4] if len(parts) > 4 else ""
        if deployment.startswith(("llm-", "LLMServer", "LLMDeployment")):
            return "frontend"  # llmserve's `llm-<model>`, Ray Serve LLM's LLMServer
        return "router"  # llmserve's Router, Ray Serve LLM's OpenAiIngress
    return "ray"


def _created(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return 0.0


def tree(pid: int) -> list[psutil.Process]:
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_by_role(processes: Iterable[psutil.Process]) -> dict[str, float]:
    """CPU seconds (user + system) so far of `processes`, by role, and of this process as the
    client."""
    out = dict.fromkeys(ROLES, 0.0)
    roles: dict[int, str] = {}
    for p in sorted(processes, key=_created):  # parents first
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            r = role(" ".join(p.cmdline()) or p.name())
            # vLLM's workers (and, on some hosts, its engine core) keep the untitled command
            # line of multiprocessing's spawn: whatever a frontend or engine started computes.
            if r == "ray" and roles.get(p.ppid()) in ("frontend", "engine"):
                r = "engine"
            roles[p.pid] = r
            out[r] += t.user + t.system
    me = psutil.Process().cpu_times()
    out["client"] = me.user + me.system
    return out


def ms_per_token(
    before: dict[str, float], after: dict[str, float], tokens: int
) -> dict[str, float]:
    """CPU ms per output token by role between two readings (processes that ended meanwhile
    are not counted: none end during a load)."""
    if tokens <= 0:
        return {}
    per = {r: round(1000 * max(0.0, after[r] - before[r]) / tokens, 3) for r in ROLES}
    per["all_but_engine"] = round(sum(v for r, v in per.items() if r != "engine"), 3)
    return per


def share_of_core(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """% of one core by role between two readings `seconds` apart: the cost a system pays with
    no request in flight, whatever its engine produces."""
    if seconds <= 0:
        return {}
    per = {r: round(100 * max(0.0, after[r] - before[r]) / seconds, 2) for r in ROLES}
    per["all_but_engine"] = round(
        sum(v for r, v in per.items() if r not in ("engine", "client")), 2
    )
    return per
