"""On a CPU-only host the engine's worker computes on cores that the rest of the platform keeps off.

vLLM's CPU worker binds its compute threads to every core but the last (`VLLM_CPU_OMP_THREADS_BIND`
auto, one core reserved for its engine core process and the server). Bare `vllm serve` has little
else to run; the platform has Ray's processes (GCS, raylet, agents, Serve's controller), HAProxy,
the Router and the replica's own event loop, which the kernel puts on the worker's cores as readily
as on the last one, and a decode step waits for its slowest thread. So the processes of Ray start
confined to the platform's cores (`LLMSERVE_PLATFORM_CORES`, by default the last core of a host
without a GPU; `off` leaves every process on every core) and every process Ray starts inherits
them. A replica widens its own thread's set to all cores only while it starts its engine: the
engine's processes inherit all cores and vLLM's worker binds itself as vLLM decides (or to
`engine.cpu_cores_by_replica`). Where the benchmarks show it: docs/benchmarks.md ("The platform
off the engine's cores").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

ENV = "LLMSERVE_PLATFORM_CORES"
# A GPU computes the engine's steps: its host's cores are the platform's, all of them.
GPU_DEVICES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))  # NVIDIA, AMD (ROCm)


def parse(text: str) -> frozenset[int]:
    """'3', '0-3,6' -> core ids; ValueError for anything else."""
    cores: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        lo, hi = int(first), int(last) if dash else int(first)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad core range {part!r}")
        cores.update(range(lo, hi + 1))
    return frozenset(cores)


def choose(value: str | None, num_cpus: int, has_gpu: bool) -> frozenset[int] | None:
    """The cores the platform's processes run on, or None for all of them. `value`: the
    variable's text (unset means `auto`)."""
    value = (value or "auto").strip().lower()
    if value == "off":
        return None
    if value == "auto":
        # One core cannot be split; a GPU host's cores are all the platform's.
        return None if has_gpu or num_cpus < 2 else frozenset({num_cpus - 1})
    try:
        cores = parse(value)
    except ValueError:
        raise ValueError(
            f"{ENV}={value!r}: give core ids like '3' or '2-3', 'auto' or 'off'"
        ) from None
    if max(cores) >= num_cpus:
        raise ValueError(f"{ENV}={value!r}: this host has cores 0-{num_cpus - 1}")
    return None if len(cores) == num_cpus else cores


def for_this_host(environ: dict[str, str] | None = None) -> frozenset[int] | None:
    environ = os.environ if environ is None else environ
    has_gpu = any(p.exists() for p in GPU_DEVICES)
    return choose(environ.get(ENV), os.cpu_count() or 1, has_gpu)


def confine_this_process(environ: dict[str, str] | None = None) -> frozenset[int] | None:
    """Confines the calling thread, and what it starts from now on (Ray's processes), to the
    platform's cores. Returns them, or None where it left everything on every core."""
    cores = for_this_host(environ)
    if cores is not None:
        os.sched_setaffinity(0, cores)
    return cores


@contextlib.contextmanager
def all_cores() -> Iterator[None]:
    """The calling thread (only it: Linux keeps a set per thread) on every core of the host for
    the block, then back: for starting an engine whose processes must be free to bind."""
    saved = os.sched_getaffinity(0)
    everything = set(range(os.cpu_count() or 1))
    if saved >= everything:
        yield
        return
    os.sched_setaffinity(0, everything)  # the kernel keeps only what the cgroup allows
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)
