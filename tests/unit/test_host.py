"""llmserve/edge/host.py: whether the CPU computes bf16 natively, from /proc/cpuinfo's flags."""

from __future__ import annotations

import pytest

from llmserve.edge.host import cpu_flags, cpu_has_native_bf16

X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma {}\n\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve {}\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [
        (X86.format(""), False),  # AVX2 only (this session's AMD EPYC): bf16 is emulated
        (X86.format("avx512f avx512bw"), False),  # AVX-512 without its BF16 extension
        (X86.format("avx512f avx512_bf16"), True),  # Zen 4, Cooper Lake and later
        (X86.format("amx_bf16 amx_tile"), True),  # Sapphire Rapids' AMX
        (ARM.format("bf16 i8mm"), True),  # Graviton 3, Neoverse V1
        (ARM.format(""), False),
        ("processor\t: 0\n", True),  # no flags line: cannot tell, change nothing
    ],
)
def test_native_bf16_from_cpu_flags(cpuinfo, expected):
    assert cpu_has_native_bf16(cpuinfo) is expected


def test_this_host_answers():
    assert isinstance(cpu_has_native_bf16(), bool)


def test_cpu_flags_are_read_from_either_architectures_line():
    assert "avx2" in cpu_flags(X86.format(""))
    assert "sve" in cpu_flags(ARM.format(""))
    assert cpu_flags("processor\t: 0\n") is None
