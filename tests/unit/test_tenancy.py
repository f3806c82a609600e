"""Tenants: API key -> tenant, per-request terms (models, max_tokens, timeout), tenant config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.config.app_config import AppConfig, TenantConfig
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.router.tenancy import (
    TenantDirectory,
    estimate_prompt_tokens,
    may_use,
    request_terms,
)

KEY_A = "sk-alpha-0000"
KEY_B = "sk-bravo-1111"
KEY_ENV = "sk-from-env-2222"


def app_config(*tenants: dict, anonymous_tenant: str | None = "anonymous", **top) -> AppConfig:
    return AppConfig.model_validate(
        {
            "models": [{"name": "m1", "source": "org/m1"}, {"name": "m2", "source": "org/m2"}],
            "tenants": list(tenants),
            "admission": {"anonymous_tenant": anonymous_tenant},
            **top,
        }
    )


def directory(*, anonymous: bool = True, environ: dict[str, str] | None = None) -> TenantDirectory:
    tenants = [
        {"name": "alpha", "api_keys": [KEY_A]},
        {"name": "bravo", "api_keys": [KEY_B], "api_key_env": ["BRAVO_KEY"]},
    ]
    if anonymous:
        tenants.append({"name": "anonymous", "priority": "batch"})
    config = app_config(*tenants, anonymous_tenant="anonymous" if anonymous else None)
    return TenantDirectory(config, {"BRAVO_KEY": KEY_ENV} if environ is None else environ)


# ------------------------------------------------------------------------------ authentication


@pytest.mark.parametrize(
    "header, tenant",
    [
        (f"Bearer {KEY_A}", "alpha"),
        (f"bearer {KEY_A}", "alpha"),  # the scheme is case-insensitive
        (f"Bearer  {KEY_A} ", "alpha"),  # surrounding blanks around the key
        (f"Bearer {KEY_B}", "bravo"),
        (f"Bearer {KEY_ENV}", "bravo"),  # a key from an environment variable
        (None, "anonymous"),
        ("", "anonymous"),
    ],
)
def test_authenticate_finds_the_tenant(header, tenant):
    assert directory().authenticate(header).name == tenant


@pytest.mark.parametrize(
    "header, code",
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        (f"Basic {KEY_A}", "invalid_api_key"),  # wrong scheme
        (KEY_A, "invalid_api_key"),  # no scheme at all
        ("Bearer", "invalid_api_key"),
        ("Bearer    ", "invalid_api_key"),
        ("Bearer sk-wrong-key-9999", "invalid_api_key"),
        (f"Bearer {KEY_A[:-1]}", "invalid_api_key"),  # a prefix of a real key
        (f"Bearer {KEY_A}x", "invalid_api_key"),  # a real key as a prefix
        (f"Bearer {KEY_A.upper()}", "invalid_api_key"),  # keys are case-sensitive
        (f"Bearer {KEY_A}{KEY_B}", "invalid_api_key"),
    ],
)
def test_authenticate_without_anonymous_rejects_with_401(header, code):
    with pytest.raises(OpenAIError) as e:
        directory(anonymous=False).authenticate(header)
    assert e.value.status == 401
    assert e.value.code == code
    assert e.value.type == "authentication_error"
    assert KEY_A not in e.value.message  # keys never echoed back


@pytest.mark.parametrize("header", ["Bearer sk-wrong-key-9999", f"Bearer {KEY_A[:-1]}"])
def test_an_unknown_key_is_401_even_where_anonymous_access_is_allowed(header):
    # As OpenAI answers it: a typo is told at once, not served as someone else.
    with pytest.raises(OpenAIError) as e:
        directory(anonymous=True).authenticate(header)
    assert (e.value.status, e.value.code) == (401, "invalid_api_key")


def test_the_router_gets_digests_never_keys():
    config = app_config({"name": "alpha", "api_keys": [KEY_A]}, {"name": "anonymous"})
    for_router = config.for_router()
    assert KEY_A not in repr(for_router)
    (alpha,) = [t for t in for_router["tenants"] if t["name"] == "alpha"]
    assert alpha["api_keys"] == [] and len(alpha["api_key_sha256"]) == 1
    d = TenantDirectory(AppConfig.model_validate(for_router), {})
    assert d.authenticate(f"Bearer {KEY_A}").name == "alpha"


def test_a_key_given_as_its_digest_authenticates():
    import hashlib

    digest = hashlib.sha256(KEY_B.encode()).hexdigest()
    d = TenantDirectory(
        app_config({"name": "b", "api_key_sha256": [digest.upper()]}, anonymous_tenant=None), {}
    )
    assert d.authenticate(f"Bearer {KEY_B}").name == "b"
    with pytest.raises(ValidationError, match="64 hex digits"):
        app_config({"name": "b", "api_key_sha256": ["abc"]}, anonymous_tenant=None)


@pytest.mark.parametrize("header", [f"Basic {KEY_A}", KEY_A])
def test_a_malformed_header_is_401_even_when_anonymous_access_is_allowed(header):
    with pytest.raises(OpenAIError) as e:
        directory(anonymous=True).authenticate(header)
    assert (e.value.status, e.value.code) == (401, "invalid_api_key")


def test_a_key_that_is_a_prefix_of_another_key_matches_only_itself():
    config = app_config(
        {"name": "short", "api_keys": ["sk-12345678"]},
        {"name": "long", "api_keys": ["sk-123456789"]},
        anonymous_tenant=None,
    )
    d = TenantDirectory(config, {})
    assert d.authenticate("Bearer sk-12345678").name == "short"
    assert d.authenticate("Bearer sk-123456789").name == "long"
    with pytest.raises(OpenAIError):
        d.authenticate("Bearer sk-1234567")


@pytest.mark.parametrize("environ", [{}, {"BRAVO_KEY": ""}, {"OTHER": KEY_ENV}])
def test_a_missing_env_var_names_the_tenant_and_the_variable(environ):
    with pytest.raises(ValueError, match=r"'bravo'.*BRAVO_KEY"):
        directory(environ=environ)


def test_env_var_keys_are_read_from_the_injected_mapping_only(monkeypatch):
    monkeypatch.setenv("BRAVO_KEY", "sk-process-env-3333")
    d = directory(environ={"BRAVO_KEY": KEY_ENV})
    assert d.authenticate(f"Bearer {KEY_ENV}").name == "bravo"
    # The process environment's value is just an unknown key.
    with pytest.raises(OpenAIError) as e:
        d.authenticate("Bearer sk-process-env-3333")
    assert e.value.status == 401


def test_several_env_vars_and_inline_keys_all_work():
    config = app_config(
        {"name": "t", "api_keys": ["sk-inline-000"], "api_key_env": ["K1", "K2"]},
        anonymous_tenant=None,
    )
    d = TenantDirectory(config, {"K1": "sk-env-one-111", "K2": "sk-env-two-222"})
    for key in ("sk-inline-000", "sk-env-one-111", "sk-env-two-222"):
        assert d.authenticate(f"Bearer {key}").name == "t"


def test_a_key_shared_by_two_tenants_through_env_vars_is_refused():
    config = app_config(
        {"name": "a", "api_keys": [KEY_A]},
        {"name": "b", "api_key_env": ["SHARED"]},
        anonymous_tenant=None,
    )
    with pytest.raises(ValueError, match="more than one tenant"):
        TenantDirectory(config, {"SHARED": KEY_A})


def test_anonymous_access_is_off_unless_configured():
    assert AppConfig.model_fields["admission"].default_factory().anonymous_tenant is None
    d = TenantDirectory(app_config({"name": "anonymous"}, anonymous_tenant=None), {})
    with pytest.raises(OpenAIError) as e:
        d.authenticate(None)
    assert (e.value.status, e.value.code) == (401, "missing_api_key")


def test_the_directory_keeps_keys_only_as_digests():
    stored = repr(vars(directory())["_keys"])
    assert KEY_A not in stored and KEY_ENV not in stored


# -------------------------------------------------------------------------------- request terms


def tenant(**kw) -> TenantConfig:
    return TenantConfig(name="t", **kw)


# (tenant kwargs, max_tokens asked, default_max_tokens) ->
#   (max_tokens, engine_max_tokens, clamped_from)
@pytest.mark.parametrize(
    "kw, asked, default, expected",
    [
        ({}, None, 256, (256, None, None)),  # no cap, no ask: engine default
        ({}, 5000, 256, (5000, 5000, None)),  # no cap: as asked
        ({"max_tokens_cap": 512}, None, 256, (256, None, None)),  # default fits the cap
        ({"max_tokens_cap": 256}, None, 256, (256, None, None)),  # default equals the cap
        ({"max_tokens_cap": 100}, None, 256, (100, 100, None)),  # default above the cap
        ({"max_tokens_cap": 512}, 100, 256, (100, 100, None)),
        ({"max_tokens_cap": 512}, 512, 256, (512, 512, None)),  # exactly the cap
        ({"max_tokens_cap": 512}, 513, 256, (512, 512, 513)),  # clamped
        ({"max_tokens_cap": 512}, 10_000, 256, (512, 512, 10_000)),
        ({"max_tokens_cap": 512, "max_tokens_over_cap": "reject"}, 512, 256, (512, 512, None)),
        ({"max_tokens_cap": 100, "max_tokens_over_cap": "reject"}, None, 256, (100, 100, None)),
    ],
)
def test_max_tokens_terms(kw, asked, default, expected):
    terms = request_terms(tenant(**kw), asked, None, default)
    assert (terms.max_tokens, terms.engine_max_tokens, terms.max_tokens_clamped_from) == expected


def test_max_tokens_over_the_cap_is_refused_when_the_tenant_says_reject():
    t = tenant(max_tokens_cap=512, max_tokens_over_cap="reject")
    with pytest.raises(OpenAIError) as e:
        request_terms(t, 513, None, 256)
    assert (e.value.status, e.value.param, e.value.code) == (
        400,
        "max_tokens",
        "max_tokens_above_limit",
    )


# (default_timeout_s, max_timeout_s, asked) -> timeout_s
@pytest.mark.parametrize(
    "default_s, max_s, asked, expected",
    [
        (60, 300, None, 60),  # tenant default
        (60, 300, 10, 10),  # a smaller timeout the client asks for
        (60, 300, 120, 120),  # a larger one, still under the cap
        (60, 300, 300, 300),
        (60, 300, 1000, 300),  # capped at the tenant maximum
        (60, 60, None, 60),
        (60, 300, 0.5, 0.5),
    ],
)
def test_timeout_terms(default_s, max_s, asked, expected):
    t = tenant(default_timeout_s=default_s, max_timeout_s=max_s)
    assert request_terms(t, None, asked, 256).timeout_s == expected


@pytest.mark.parametrize("asked", [0, -1, float("nan"), float("inf"), float("-inf")])
def test_a_bad_timeout_is_400(asked):
    with pytest.raises(OpenAIError) as e:
        request_terms(tenant(), None, asked, 256)
    assert (e.value.status, e.value.param) == (400, "timeout")


@pytest.mark.parametrize(
    "models, model, allowed",
    [
        (None, "m1", True),  # None: every model
        (["m1"], "m1", True),
        (["m1"], "m2", False),
        (["m1", "m2"], "m2", True),
        ([], "m1", False),  # an empty list: no model at all
    ],
)
def test_model_access(models, model, allowed):
    served = app_config(anonymous_tenant=None).served()[model]
    assert may_use(tenant(models=models), model, served) is allowed


@pytest.mark.parametrize(
    "num_chars, expected", [(0, 1), (1, 1), (2, 1), (3, 2), (300, 101), (3000, 1001)]
)
def test_estimate_prompt_tokens_errs_high(num_chars, expected):
    assert estimate_prompt_tokens(num_chars) == expected
    assert estimate_prompt_tokens(num_chars) >= num_chars / 4  # English BPE is ~4 chars/token


# ------------------------------------------------------------------------ tenant config checks

NO_ANON = {"anonymous_tenant": None}


@pytest.mark.parametrize(
    "tenants, admission, message",
    [
        ([{"name": "a"}, {"name": "a"}], NO_ANON, "tenant names must be unique"),
        (
            [{"name": "a", "api_keys": [KEY_A]}, {"name": "b", "api_keys": [KEY_A]}],
            NO_ANON,
            "more than one tenant",
        ),
        ([{"name": "a", "priority": "urgent"}], NO_ANON, "priority 'urgent'"),
        (
            [{"name": "a", "priority": "batch"}],
            {**NO_ANON, "priority_levels": {"interactive": 0, "standard": 1}},
            "priority 'batch'",
        ),
        ([{"name": "a", "models": ["m1", "x"]}], NO_ANON, r"unknown models \['x'\]"),
        ([{"name": "a"}], {"anonymous_tenant": "anonymous"}, "anonymous_tenant 'anonymous' is not"),
        (
            [{"name": "a", "default_timeout_s": 120, "max_timeout_s": 60}],
            NO_ANON,
            "default_timeout_s 120.0 is above max_timeout_s 60.0",
        ),
        ([{"name": "a", "api_keys": ["short"]}], NO_ANON, "at least 8"),
        ([{"name": "bad name"}], NO_ANON, "tenant name"),
        ([{"name": "a", "max_tokens_over_cap": "truncate"}], NO_ANON, "clamp"),
        ([{"name": "a", "rate_limits": {"requests_per_s": 0}}], NO_ANON, "greater than 0"),
        ([{"name": "a", "max_concurrent_requests": 0}], NO_ANON, "greater than 0"),
        ([{"name": "a", "api_key": KEY_A}], NO_ANON, "Extra inputs"),  # typo
        (
            [{"name": "a"}],
            {**NO_ANON, "max_queue_wait_s_by_class": {"bulk": 60}},
            r"unknown classes \['bulk'\]",
        ),
        ([{"name": "a"}], {**NO_ANON, "max_queue_wait_s_by_class": {"batch": 0}}, "greater than 0"),
        ([{"name": "a"}], {**NO_ANON, "max_queue_wait_s": "inf"}, "finite"),
        (
            [{"name": "a"}],
            {
                **NO_ANON,
                "priority_levels": {"gold": 0, "silver": 0},
                "max_queue_wait_s_by_class": {"gold": 5, "silver": 9},
            },
            "classes of level 0 must have the same bound",
        ),
    ],
)
def test_bad_tenant_config_is_refused_with_a_clear_message(tenants, admission, message):
    with pytest.raises(ValidationError, match=message):
        AppConfig.model_validate(
            {
                "models": [{"name": "m1", "source": "org/m1"}],
                "tenants": tenants,
                "admission": admission,
            }
        )


@pytest.mark.parametrize(
    "tenants, admission",
    [
        ([], {}),  # a config for tools (plan, prepare); build_app refuses it
        ([{"name": "anonymous"}], {}),
        ([{"name": "anonymous"}], {"anonymous_tenant": "anonymous"}),
        ([{"name": "a", "api_keys": [KEY_A]}], NO_ANON),
        ([{"name": "a", "default_timeout_s": 60, "max_timeout_s": 60}], NO_ANON),
        ([{"name": "a", "priority": "gold"}], {**NO_ANON, "priority_levels": {"gold": 0}}),
        ([{"name": "a", "models": ["m1"], "api_key_env": ["A_KEY"]}], NO_ANON),
        ([{"name": "a"}], {**NO_ANON, "max_queue_wait_s_by_class": {"batch": 60}}),
    ],
)
def test_good_tenant_config_is_accepted(tenants, admission):
    AppConfig.model_validate(
        {
            "models": [{"name": "m1", "source": "org/m1"}],
            "tenants": tenants,
            "admission": admission,
        }
    )
