"""LoRA adapters: the config's names and limits, who may use an adapter, the argv its engines get,
and how /v1/models lists it (the real engine: tests/integration/test_openai_api.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from llmserve.config.app_config import AppConfig
from llmserve.config.lora_config import served_names
from llmserve.replica.vllm_args import launch
from llmserve.router.openapi_docs import models_list
from llmserve.router.tenancy import may_use

LORA = {
    "max_loras": 2,
    "max_lora_rank": 8,
    "adapters": [
        {"name": "base-support", "source": "/adapters/support"},
        {"name": "base-legal", "source": "/adapters/legal", "tenants": ["legal"]},
    ],
}


def config(lora=LORA, tenants=None, **model) -> AppConfig:
    return AppConfig(
        models=[
            {"name": "base", "source": "org/base", "lora": lora, **model},
            {"name": "other", "source": "org/other"},
        ],
        tenants=tenants
        or [
            {"name": "all"},
            {"name": "legal"},
            {"name": "support-only", "models": ["base-support"]},
            {"name": "legal-base", "models": ["base"]},
        ],
    )


def test_an_adapter_is_served_by_its_base_model():
    c = config()
    assert served_names(c.models) == {
        "base": "base",
        "base-support": "base",
        "base-legal": "base",
        "other": "other",
    }
    assert c.model("base-legal").name == "base" and c.model("other").name == "other"
    assert c.model("nope") is None


@pytest.mark.parametrize(
    "change, words",
    [
        ({"lora": {**LORA, "adapters": [LORA["adapters"][0], LORA["adapters"][0]]}}, "twice"),
        ({"lora": {**LORA, "adapters": [{"name": "other", "source": "/a"}]}}, "twice"),
        ({"lora": {**LORA, "adapters": [{"name": "bad name", "source": "/a"}]}}, "adapter name"),
        ({"lora": {**LORA, "adapters": [{"name": "base-x", "source": " "}]}}, "must not be empty"),
        ({"lora": {**LORA, "max_cpu_loras": 1}}, "max_cpu_loras"),
        ({"lora": {**LORA, "max_lora_rank": 0}}, "greater than 0"),
        ({"lora": LORA, "source": "simulated"}, "lora needs a real model source"),
    ],
)
def test_a_wrong_lora_config_says_what_is_wrong(change, words):
    with pytest.raises(ValidationError, match=words):
        AppConfig(
            models=[
                {"name": "base", "source": "org/base", **change},
                {"name": "other", "source": "o/o"},
            ]
        )


def test_an_adapter_for_an_unknown_tenant_is_refused():
    with pytest.raises(ValidationError, match="adapter 'base-legal': unknown tenants"):
        config(tenants=[{"name": "all"}])


def test_a_tenant_may_list_an_adapter_and_an_unknown_name_is_refused():
    config()  # support-only lists an adapter: valid
    with pytest.raises(ValidationError, match="unknown models"):
        config(tenants=[{"name": "legal"}, {"name": "x", "models": ["base-nope"]}])


@pytest.mark.parametrize(
    "tenant, name, allowed",
    [
        ("all", "base", True),
        ("all", "base-support", True),
        ("all", "base-legal", False),  # the adapter names its tenants
        ("legal", "base-legal", True),
        ("support-only", "base-support", True),
        ("support-only", "base", False),  # its list names the adapter, not the base
        ("support-only", "base-legal", False),
        ("legal-base", "base", True),
        ("legal-base", "base-support", False),  # no `tenants`: its own list must name it
        ("legal-base", "base-legal", False),  # the adapter names "legal", not "legal-base"
    ],
)
def test_who_may_use_an_adapter(tenant, name, allowed):
    c = config()
    t = next(t for t in c.tenants if t.name == tenant)
    assert may_use(t, name, c.served()[name]) is allowed


def test_an_adapter_naming_a_tenant_is_a_grant_where_its_list_names_the_base():
    # A runtime adapter cannot be in a list written before it existed: the adapter's own
    # `tenants` grants it, to a tenant whose list names its base model.
    adapters = [{"name": "base-legal", "source": "/a", "tenants": ["legal", "listed"]}]
    tenants = [
        {"name": "legal"},
        {"name": "listed", "models": ["base"]},
        {"name": "elsewhere", "models": ["other"]},
    ]
    c = config(lora={**LORA, "adapters": adapters}, tenants=tenants)
    served = c.served()["base-legal"]
    by_name = {t.name: t for t in c.tenants}
    assert may_use(by_name["legal"], "base-legal", served)
    assert may_use(by_name["listed"], "base-legal", served)
    assert not may_use(by_name["elsewhere"], "base-legal", served)  # named, but not its base


def test_the_engine_loads_every_adapter_at_start_with_the_limits():
    c = config(engine={"max_model_len": 512})
    argv = launch(c.models[0], "/models/base", native_bf16=True).argv
    pairs = dict(zip(argv, argv[1:]))
    assert "--enable-lora" in argv
    assert pairs["--max-loras"] == "2" and pairs["--max-lora-rank"] == "8"
    assert "--max-cpu-loras" not in argv  # vLLM's default
    start = argv.index("--lora-modules") + 1
    modules = [json.loads(a) for a in argv[start : start + 2]]
    assert modules == [
        {"name": "base-support", "path": "/adapters/support", "base_model_name": "base"},
        {"name": "base-legal", "path": "/adapters/legal", "base_model_name": "base"},
    ]
    assert "--enable-lora" not in launch(c.models[1], "/models/other", native_bf16=True).argv


def test_lora_without_adapters_starts_the_engine_with_lora_for_adapters_at_runtime():
    c = config(lora={"max_loras": 2, "max_lora_rank": 8}, tenants=[{"name": "all"}])
    assert c.models[0].lora.adapters == [] and c.served().keys() == {"base", "other"}
    argv = launch(c.models[0], "/models/base", native_bf16=True).argv
    assert "--enable-lora" in argv and "--lora-modules" not in argv


def test_models_list_names_an_adapters_parent():
    listed = models_list({"base": "base", "base-support": "base"}, created=1)["data"]
    assert listed == [
        {"id": "base", "object": "model", "created": 1, "owned_by": "llmserve"},
        {
            "id": "base-support",
            "object": "model",
            "created": 1,
            "owned_by": "llmserve",
            "parent": "base",
        },
    ]


def test_random_needs_a_whole_seed():
    with pytest.raises(ValidationError, match="random:SEED takes a whole number"):
        config(lora={"adapters": [{"name": "a", "source": "random:x"}]}, tenants=[{"name": "t"}])


def test_a_random_adapter_is_built_once_into_the_cache_and_a_folder_is_used_as_given(tmp_path):
    from transformers import LlamaConfig

    from llmserve.planning.adapters import adapter_dir, with_adapter_dirs

    base = tmp_path / "base"
    LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    ).save_pretrained(base)
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "adapter_config.json").write_text("{}")
    adapters = [{"name": "r", "source": "random:3"}, {"name": "f", "source": str(tmp_path / "f")}]
    c = config(lora={"adapters": adapters}, tenants=[{"name": "all"}])
    m = with_adapter_dirs(c.models[0], str(base), tmp_path / "cache")
    built, folder = (a.source for a in m.lora.adapters)
    assert folder == str(tmp_path / "f") and built == str(
        tmp_path / "cache" / "adapters" / "base" / "r-seed3"
    )
    peft = json.loads((Path(built) / "adapter_config.json").read_text())
    assert peft["r"] == 8 and peft["target_modules"] == ["q_proj", "v_proj"]
    from safetensors import safe_open

    with safe_open(str(Path(built) / "adapter_model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"] == (64, 8)
    assert shapes["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"] == (32, 8)
    made = (Path(built) / "adapter_model.safetensors").stat().st_mtime_ns
    again = adapter_dir(c.models[0], c.models[0].lora.adapters[0], str(base), tmp_path / "cache")
    assert again == built and (Path(again) / "adapter_model.safetensors").stat().st_mtime_ns == made


def test_a_folder_that_is_no_adapter_is_named_before_the_engine_starts(tmp_path):
    from llmserve.planning.adapters import with_adapter_dirs

    c = config(lora={"adapters": [{"name": "f", "source": str(tmp_path)}]}, tenants=[{"name": "a"}])
    with pytest.raises(FileNotFoundError, match="adapter 'f': .* has no adapter_config.json"):
        with_adapter_dirs(c.models[0], "/models/base", tmp_path / "cache")


def test_an_adapter_from_an_installed_package_or_the_hub(tmp_path, monkeypatch):
    """`pypi:PACKAGE` is the folder of an installed package (not imported); a hub id goes to
    vLLM as is (it downloads it)."""
    from llmserve.planning.adapters import adapter_dir

    pkg = tmp_path / "site" / "llmserve_fake_adapter"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (pkg / "adapter_config.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sources = ["pypi:llmserve-fake-adapter", "org/support-lora", "pypi:llmserve-not-there"]
    c = config(
        lora={"adapters": [{"name": f"a{i}", "source": s} for i, s in enumerate(sources)]},
        tenants=[{"name": "all"}],
    )
    m = c.models[0]
    packaged, hub, missing = m.lora.adapters
    assert adapter_dir(m, packaged, "/models/base", tmp_path) == str(pkg)
    assert adapter_dir(m, hub, "/models/base", tmp_path) == "org/support-lora"
    with pytest.raises(FileNotFoundError, match=r"'a2': .*not installed \(pip install it on"):
        adapter_dir(m, missing, "/models/base", tmp_path)
