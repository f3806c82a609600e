"""What ships is local-only: the HTTP API and the Ray dashboard bind to 127.0.0.1, Ray starts
with token auth in its loopback-only mode, and the shipped config holds no key at all (the
documented demo keys as digests only, marked as the local demo's)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmserve.config.app_config import AppConfig

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_binds_the_http_api_to_localhost():
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert doc["http_options"]["host"] == "127.0.0.1"


def test_make_serve_binds_the_dashboard_to_localhost():
    # The dashboard submits jobs (runs code): it must never listen on a public address.
    makefile = (ROOT / "Makefile").read_text()
    starts = [line for line in makefile.replace("\\\n", " ").splitlines() if "ray start" in line]
    assert starts
    for line in starts:
        assert re.search(r"--dashboard-host[ =]127\.0\.0\.1\b", line), line


def test_shipped_config_holds_no_key_only_the_demo_digests():
    text = (ROOT / "serve_config.yaml").read_text()
    doc = yaml.safe_load(text)
    cfg = AppConfig.model_validate(doc["applications"][0]["args"])
    assert not any(t.api_keys or t.api_key_env for t in cfg.tenants)
    demo = {t.name for t in cfg.tenants if t.api_key_sha256}
    assert demo == {"demo-interactive", "demo-batch"}
    # The demo keys are in comments (the README lists them), never as values.
    assert all(line.lstrip().startswith("#") for line in text.splitlines() if "sk-demo" in line)
    assert text.count("LOCAL DEMO ONLY") >= 2  # anonymous access and the demo keys say so


def test_make_serve_starts_ray_with_token_auth_on_loopback():
    from llmserve.edge.ray_env import cluster_env

    env = cluster_env()
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in cluster_env(single_machine=False)
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    serve = makefile[makefile.index("\nserve:") :].split("\n\n")[0]
    assert "llmserve ray-env" in serve and serve.index("ray-env") < serve.index("ray start")
