"""What ships is local-only: the HTTP API and the Ray dashboard bind to 127.0.0.1, and the shipped
config holds no production keys (only the documented demo keys, inline)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from serve_app.config import AppConfig

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


def test_shipped_config_has_only_the_demo_keys_inline():
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    cfg = AppConfig.model_validate(doc["applications"][0]["args"])
    inline = [k for t in cfg.tenants for k in t.api_keys]
    assert inline and all(k.startswith("sk-demo-") for k in inline), inline
    # A config that is logged or printed does not show them.
    assert not any(k in repr(cfg) for k in inline)
