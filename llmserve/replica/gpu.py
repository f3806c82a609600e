"""GPU utilisation and memory through NVML, for the replica that owns the GPU(s).

`read_gpus()` returns nothing at all where there is no GPU or no NVML library (this CPU machine),
so the metrics are absent rather than zero. The NVML module is a parameter so that tests can
stand in for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class GpuSample:
    index: int  # NVML index
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


def _visible(count: int) -> list[int]:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    return [int(x) for x in raw.split(",") if x.strip().isdigit() and int(x) < count]


def read_gpus(nvml: ModuleType | None = None) -> list[GpuSample]:
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound and friends: no GPU here
        return []
    samples = []
    for i in _visible(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        samples.append(GpuSample(i, float(util.gpu), int(mem.used), int(mem.total)))
    return samples
