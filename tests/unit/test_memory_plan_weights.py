"""llmserve/planning/weights.py: parameter counts, weight bytes per scheme and what is read from
a model's config, against figures worked out by hand.

Every expected number below is a literal with its arithmetic in a comment, so a wrong formula in
the module cannot agree with itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmserve.planning import weights as wt
from tests.unit.hf_configs import LLAMA_2_7B, LLAMA_3_8B, QWEN2_0_5B, SMOLLM2_135M, shape

FIXTURES = Path(__file__).parent / "fixtures"


# ---- parameter counts -------------------------------------------------------------------------


def test_smollm2_parameter_count():
    c = wt.count_params(shape(SMOLLM2_135M))
    assert c.embedding == 28_311_552  # 49152 x 576
    assert c.lm_head == 0  # tied to the embedding
    # per layer: q 576x576 = 331,776; k, v 576x(3x64) = 110,592 each; o 331,776;
    # gate, up, down 576x1536 = 884,736 each -> 3,538,944; x 30 layers
    assert c.layer_linear == 106_168_320
    assert c.layer_other == 35_136  # 2 norms x 576 x 30 + final norm 576
    assert c.total == 134_515_008  # the sum of the converted safetensors' tensor sizes


def test_llama_2_7b_parameter_count():
    c = wt.count_params(shape(LLAMA_2_7B))
    assert c.embedding == c.lm_head == 131_072_000  # 32000 x 4096, untied
    # per layer: 4 x 4096^2 = 67,108,864 + 3 x 4096 x 11008 = 135,266,304 -> 202,375,168; x 32
    assert c.layer_linear == 6_476_005_376
    assert c.layer_other == 266_240  # 32 x 2 x 4096 + 4096
    assert c.total == 6_738_415_616  # "6.74B"


def test_llama_3_8b_parameter_count():
    c = wt.count_params(shape(LLAMA_3_8B))
    # embedding 128256 x 4096 = 525,336,576, twice; per layer q, o 4096^2 = 16,777,216 each,
    # k, v 4096 x 1024 = 4,194,304 each, mlp 3 x 4096 x 14336 = 176,160,768 -> 218,103,808;
    # x 32 = 6,979,321,856; norms 32 x 8192 + 4096 = 266,240
    assert c.total == 8_030_261_248  # "8.03B"


def test_qwen2_counts_qkv_biases():
    c = wt.count_params(shape(QWEN2_0_5B))
    # embedding 151936 x 896 = 136,134,656 (tied); per layer linear 2 x 896^2 + 2 x 896 x 128
    # + 3 x 896 x 4864 = 14,909,440, biases 896 + 2 x 128 = 1,152, norms 1,792; x 24; + 896
    assert c.total == 494_032_768  # Qwen2-0.5B's published count


# ---- weight bytes per scheme ------------------------------------------------------------------


def test_llama_2_7b_weight_bytes_per_scheme():
    s = shape(LLAMA_2_7B)
    # unquantized under every scheme: (2 x 131,072,000 + 266,240) x 2 bytes = 524,820,480
    assert wt.weight_bytes(s, wt.scheme("fp16")) == 13_476_831_232  # 6,738,415,616 x 2 (12.55 GiB)
    # int4 g128: 6,476,005,376 / 2 = 3,238,002,688 + groups 6,476,005,376 / 128 = 50,593,792
    # x (16-bit scale + 4-bit zero) 2.5 bytes = 126,484,480 + 524,820,480
    assert wt.weight_bytes(s, wt.scheme("int4")) == 3_889_307_648  # ~3.89 GB like AWQ checkpoints
    # int8: 6,476,005,376 + output channels (4 x 4096 + 2 x 11008 + 4096) x 32 = 1,359,872
    # x 4-byte scales = 5,439,488 + 524,820,480
    assert wt.weight_bytes(s, wt.scheme("int8")) == 7_006_265_344
    # fp8: 6,476,005,376 + 7 tensors x 32 layers x 4-byte scale = 896 + 524,820,480
    assert wt.weight_bytes(s, wt.scheme("fp8")) == 7_000_826_752


def test_int4_group_size_changes_the_overhead():
    s = shape(LLAMA_2_7B)
    # group 64 doubles the groups: 6,476,005,376 / 64 x 2.5 = 252,968,960 of overhead
    assert wt.weight_bytes(s, wt.scheme("int4", 64)) == 3_238_002_688 + 252_968_960 + 524_820_480
    with pytest.raises(wt.MemoryPlanError, match="group size"):
        wt.scheme("int4", 0)


def test_smollm2_bf16_weight_bytes_and_float32():
    s = shape(SMOLLM2_135M)
    assert wt.weight_bytes(s, wt.scheme("bf16")) == 269_030_016  # 134,515,008 x 2
    assert wt.weight_bytes(s, wt.scheme("fp16"), dtype_bytes=4) == 538_060_032  # x 4
    assert wt.dtype_bytes_for("float32") == 4 and wt.dtype_bytes_for("auto") == 2


# ---- reading configs --------------------------------------------------------------------------


def test_config_without_kv_heads_or_head_dim_is_plain_mha():
    cfg = {k: v for k, v in LLAMA_2_7B.items() if k != "num_key_value_heads"}
    s = shape({**cfg, "head_dim": None})
    assert (s.num_kv_heads, s.head_dim) == (32, 128)  # 4096 / 32


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"num_local_experts": 8}, "mixture-of-experts"),
        ({"kv_lora_rank": 512}, "latent attention"),
        ({"hidden_size": None}, "lacks hidden_size"),
    ],
)
def test_unsupported_configs_say_why(extra, match):
    with pytest.raises(wt.MemoryPlanError, match=match):
        shape({**LLAMA_2_7B, **extra})


def test_fixture_files_are_the_dicts_of_hf_configs():
    # The README's examples plan these files; they must stay the model cards' numbers.
    assert json.loads((FIXTURES / "llama-2-7b.json").read_text()) == LLAMA_2_7B
    assert json.loads((FIXTURES / "llama-3-8b.json").read_text()) == LLAMA_3_8B


@pytest.mark.parametrize(
    "quantization, qc, expected",
    [
        (None, None, "fp16"),
        ("fp8", None, "fp8"),
        ("awq_marlin", None, "int4"),
        (None, {"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8"),
        (None, {"quant_method": "awq", "bits": 4, "group_size": 64}, "int4"),
        ("bitsandbytes", {"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
        ("experts_int8", None, None),
        (
            None,
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 8, "type": "int", "group_size": None}}
                },
            },
            "int8",
        ),
        (
            None,
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 32}}
                },
            },
            "int4",
        ),
        (
            None,
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
            },
            "fp8",
        ),
        (None, {"quant_method": "compressed-tensors", "config_groups": {}}, None),
    ],
)
def test_configured_scheme(quantization, qc, expected):
    hf = {"quantization_config": qc} if qc else {}
    assert wt.configured_scheme(quantization, hf) == expected


@pytest.mark.parametrize(
    "qc, expected",
    [
        ({}, 128),
        ({"quant_method": "awq", "q_group_size": 64}, 64),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 32}}
                },
            },
            32,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 8, "type": "int", "group_size": None}}
                },
            },
            128,
        ),
    ],
)
def test_group_size_of(qc, expected):
    assert wt.group_size_of({"quantization_config": qc}) == expected
