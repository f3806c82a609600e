"""bench/quant_report.py's pure parts, and the CUDA run's config and script (which cannot run
here: no GPU) checked against each other and against the support table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from bench import quant_report
from llmserve.config.app_config import AppConfig
from llmserve.ops.cli import app_configs

ROOT = Path(__file__).resolve().parents[2]
CUDA_CONFIG = ROOT / "bench" / "configs" / "quant_cuda.yaml"
CUDA_SCRIPT = ROOT / "bench" / "quant_report_cuda.sh"


def test_agreement_counts_positions_and_identical_answers():
    ref = [[1, 2, 3], [4, 5], [6]]
    ours = [[1, 2, 3], [4, 9, 7], []]
    # 3 + 1 + 0 equal positions over 3 + 3 + 1; one identical answer
    share, identical = quant_report.agreement(ours, ref)
    assert share == pytest.approx(4 / 7) and identical == 1


def test_engine_args_per_platform():
    assert "gpu_memory_utilization" not in quant_report.engine_args("cpu")
    cuda = quant_report.engine_args("cuda")
    assert cuda["gpu_memory_utilization"] == quant_report.GPU_MEMORY_UTILIZATION
    assert {k: v for k, v in cuda.items() if k in quant_report.ENGINE} == quant_report.ENGINE


def row(**kw) -> dict:
    base = {
        "run": "m",
        "quantize": None,
        "engine_quantization": None,
        "weight_file_bytes": 269e6,
        "worker_rss_bytes": 2 * 2**30,
        "kv_blocks": 364,
        "kv_tokens": 46592,
        "tokens_per_s": {"1": 15.3, "32": 461.0},
        "perplexity": 24.04,
        "greedy_agreement": 1.0,
        "greedy_identical": 10,
        "greedy_token_ids": [[1]] * 10,
        "gpu_weight_bytes": None,
        "gpu_allocated_bytes": None,
    }
    return {**base, **kw}


def test_cpu_table_shows_worker_rss():
    (header, _, line) = quant_report.table([row()]).splitlines()
    assert "worker RSS" in header and "GPU" not in header
    assert line == (
        "| m | bf16 | 269 MB | 2.00 GiB | 364 (46592) | 15.3 | 461 | 24.04 | 100% | 10/10 |"
    )


def test_cuda_table_shows_gpu_memory_and_the_checkpoints_own_quantization():
    r = row(
        run="awq",
        engine_quantization="awq",
        gpu_weight_bytes=458e6,
        gpu_allocated_bytes=40 * 2**30,
        greedy_agreement=0.5,
        greedy_identical=3,
    )
    (header, sep, line) = quant_report.table([r], platform="cuda").splitlines()
    assert "GPU weights | GPU allocated" in header
    assert header.count("|") == sep.count("|") == line.count("|")
    assert "| awq | awq | 269 MB | 458 MB | 40.00 GiB |" in line and "| 50% | 3/10 |" in line


def test_checkpoint_quantization_is_read_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "awq"}})
    )
    assert quant_report._checkpoint_quantization(tmp_path) == "awq"
    (tmp_path / "config.json").write_text("{}")
    assert quant_report._checkpoint_quantization(tmp_path) is None


def test_cuda_config_puts_every_model_on_a_gpu_within_its_memory():
    (config,) = app_configs(CUDA_CONFIG)
    assert all(m.deployment.num_gpus > 0 for m in config.models)
    assert sum(m.deployment.num_gpus for m in config.models) <= 1  # one GPU
    assert sum(m.engine.gpu_memory_utilization for m in config.models) <= 0.95
    schemes = {m.quantize for m in config.models}
    assert "fp8" in schemes  # refused on CPU (next test), accepted for CUDA replicas


def test_the_same_fp8_model_is_refused_on_cpu():
    (config,) = app_configs(CUDA_CONFIG)
    fp8 = next(m for m in config.models if m.quantize == "fp8").model_dump()
    fp8["deployment"]["num_gpus"] = 0
    with pytest.raises(ValidationError, match="does not run on CPU"):
        AppConfig.model_validate({"models": [fp8]})


def test_cuda_script_reports_on_models_of_its_config():
    (config,) = app_configs(CUDA_CONFIG)
    script = CUDA_SCRIPT.read_text()
    assert "CONFIG=bench/configs/quant_cuda.yaml" in script
    commands = [
        c.split() for c in script.replace("\\\n", " ").splitlines() if "bench.quant_report" in c
    ]
    assert len(commands) == 2 and all("--platform" in c and "cuda" in c for c in commands)
    named = []
    for tokens in commands:
        after = tokens[tokens.index("--models") + 1 :]
        named += after[: next(i for i, t in enumerate(after) if t.startswith("--"))]
    assert sorted(named) == sorted(m.name for m in config.models)  # every model, once
