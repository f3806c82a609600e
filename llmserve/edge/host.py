"""What this host's CPU computes natively, read from /proc/cpuinfo.

Without the AVX-512 BF16 or AMX instructions (x86) or the BF16 extension (aarch64) a CPU
emulates bf16 arithmetic, so a bf16 model computes several times slower than the same model in
float32 (docs/configuration.md, `dtype`), and vLLM's `--dtype auto`
(the model's own bf16) gets that slow path. The platform's `dtype: auto` takes float32 there
(llmserve/replica/vllm_args.py).
"""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 x2, aarch64


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The CPU's feature flags (x86 `flags`, aarch64 `Features`), or None where it cannot tell
    (not Linux)."""
    if cpuinfo is None:
        if platform.system() != "Linux" or not CPUINFO.exists():
            return None
        cpuinfo = CPUINFO.read_text(errors="replace")
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 natively; True where it cannot tell (not Linux), so that
    nothing changes there."""
    flags = cpu_flags(cpuinfo)
    return True if flags is None else bool(NATIVE_BF16_FLAGS & flags)
