"""llmserve/edge/haproxy_loopback.sh: what it changes in the config Ray writes for HAProxy before
starting it (the real start is in the integration tests: every app runs behind it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

WRAPPER = Path(__file__).resolve().parents[2] / "llmserve" / "edge" / "haproxy_loopback.sh"


def _run_wrapper(config: str, tmp_path: Path) -> str:
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(config)
    env = {**os.environ, "LLMSERVE_HAPROXY_REAL": "/bin/true"}  # edit the file, start nothing
    subprocess.run(["sh", str(WRAPPER), "-db", "-f", str(cfg)], env=env, check=True)
    return cfg.read_text()


def test_rays_template_still_has_what_the_wrapper_changes():
    # If Ray's template drops these, the wrapper's edits are moot: this says so.
    assert "option splice-request" in HAPROXY_CONFIG_TEMPLATE
    assert "option abortonclose" in HAPROXY_CONFIG_TEMPLATE
    assert "option redispatch 1" in HAPROXY_CONFIG_TEMPLATE


def test_listeners_on_loopback_and_request_splicing_off(tmp_path):
    out = _run_wrapper(
        "defaults\n"
        "    mode http\n"
        "    option abortonclose\n"
        "    option splice-request\n"
        "    option splice-response\n"
        "    option redispatch 1\n"
        "    retry-on conn-failure empty-response\n"
        "frontend stats\n"
        "    bind *:8404\n"
        "frontend metrics\n"
        "    bind :9101\n"
        "frontend api\n"
        "    bind 127.0.0.1:8000\n",
        tmp_path,
    )
    lines = [line.strip() for line in out.splitlines()]
    # A client leaving before a non-streamed answer reaches the Router only without it.
    assert "option splice-request" not in lines
    assert "option abortonclose" in lines and "option splice-response" in lines
    # Requests kept whole, so that one whose Router died before answering is retried.
    assert lines.index("option http-buffer-request") == lines.index("option redispatch 1") + 1
    binds = [line for line in lines if line.startswith("bind ")]
    assert binds == ["bind 127.0.0.1:8404", "bind 127.0.0.1:9101", "bind 127.0.0.1:8000"]
