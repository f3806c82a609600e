"""The shield (serve_app/shield.py): each key's limit, the files a Router leaves for HAProxy, and
the real HAProxy (the binary Ray bundles) started through serve_app/haproxy_loopback.sh with
them, in front of a plain HTTP server standing in for the Routers."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from serve_app import shield
from serve_app.config import AppConfig, key_digest
from serve_app.ray_env import SHIELD_DIR_ENV, cluster_env
from serve_app.tenancy import TenantDirectory

WRAPPER = Path(__file__).resolve().parents[2] / "serve_app" / "haproxy_loopback.sh"
LIMITED, OTHER, FROM_ENV = "sk-limited-0000", "sk-unlimited-1111", "sk-limited-env-2222"


def _directory(factor: float = 2.0, anonymous: bool = True) -> tuple[TenantDirectory, float]:
    config = AppConfig.model_validate(
        {
            "models": [{"name": "m1", "source": "org/m1"}],
            "admission": {
                "anonymous_tenant": "anonymous" if anonymous else None,
                "shield_factor": factor,
            },
            "tenants": [
                {
                    "name": "limited",
                    "api_keys": [LIMITED],
                    "api_key_env": ["LIMITED_KEY"],
                    "rate_limits": {"requests_per_s": 1, "max_burst_requests": 4},
                },
                {"name": "unlimited", "api_keys": [OTHER]},
                {"name": "anonymous", "rate_limits": {"requests_per_s": 2.5}},
            ],
        }
    )
    return TenantDirectory(config, {"LIMITED_KEY": FROM_ENV}), config.admission.shield_factor


def test_a_keys_limit_is_the_factor_times_what_its_bucket_admits_in_a_second():
    directory, factor = _directory()
    # limited: 2 x (burst 4 + 1/s); anonymous: 2 x (burst max(1, 2.5) + 2.5/s).
    limited = shield.KeyLimit(limit=10, burst=4, tenant="limited")
    assert shield.key_limits(directory, factor) == {
        key_digest(LIMITED): limited,
        key_digest(FROM_ENV): limited,
        shield.ANONYMOUS: shield.KeyLimit(limit=10, burst=2, tenant="anonymous"),
    }
    directory, factor = _directory(anonymous=False)
    assert shield.ANONYMOUS not in shield.key_limits(directory, factor)


@pytest.mark.parametrize("factor", [1, 1.99, -2, float("inf")])
def test_a_factor_that_could_refuse_what_the_bucket_admits_is_rejected(factor):
    with pytest.raises(ValidationError, match="shield_factor"):
        _directory(factor)


def test_publish_leaves_digests_and_rules_for_haproxy_and_removes_them_when_off(tmp_path):
    directory, factor = _directory()
    environ = {SHIELD_DIR_ENV: str(tmp_path)}
    app_map = shield.publish(directory, factor, "app1", environ)
    assert app_map == tmp_path / "apps" / "app1.map"
    text = app_map.read_text()
    assert f"{key_digest(LIMITED)} 10 4 limited\n" in text
    assert LIMITED not in text and FROM_ENV not in text  # digests only
    assert stat.S_IMODE(app_map.stat().st_mode) == 0o600
    assert str(tmp_path / "shield.map") in (tmp_path / "rules.cfg").read_text()
    off, _ = _directory(factor=0)
    shield.publish(off, 0, "app1", environ)
    assert not app_map.exists()
    assert shield.publish(directory, factor, "app1", {}) is None
    assert cluster_env(port_base=20000)[SHIELD_DIR_ENV] != cluster_env()[SHIELD_DIR_ENV]


def test_a_folder_others_can_write_to_is_refused(tmp_path):
    directory, factor = _directory()
    folder = tmp_path / "shield"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(PermissionError, match="not a folder of this user's alone"):
        shield.publish(directory, factor, "app1", {SHIELD_DIR_ENV: str(folder)})
    assert not (folder / "rules.cfg").exists()


def _wrap(cfg: Path, env: dict[str, str]) -> str:
    env = {**os.environ, **env, "LLMSERVE_HAPROXY_REAL": "/bin/true"}  # edit, start nothing
    subprocess.run(["sh", str(WRAPPER), "-db", "-f", str(cfg)], env=env, check=True)
    return cfg.read_text()


CONFIG = """\
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend prometheus
    bind 127.0.0.1:{metrics}
    http-request use-service prometheus-exporter
frontend http_frontend
    bind 127.0.0.1:{port}
    acl is_app1 path_beg /
    use_backend app1 if is_app1
    default_backend default_backend
backend default_backend
    http-request return status 404
backend app1
    server r1 127.0.0.1:{backend}
"""


def test_the_wrapper_merges_the_apps_maps_and_puts_the_rules_before_the_backends(tmp_path):
    directory, factor = _directory()
    environ = {SHIELD_DIR_ENV: str(tmp_path / "shield")}
    shield.publish(directory, factor, "app1", environ)
    shield.publish(directory, factor, "app2", environ)  # the same key in two apps: limits add
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(CONFIG.format(metrics=1, port=2, backend=3))
    lines = [line.strip() for line in _wrap(cfg, environ).splitlines()]
    assert (
        lines.index("frontend http_frontend")
        < lines.index("# llmserve-shield (serve_app/shield.py): a key's requests over its limit")
        < lines.index("use_backend app1 if is_app1")
    )
    merged_map = tmp_path / "shield" / "shield.map"
    assert stat.S_IMODE(merged_map.stat().st_mode) == 0o600
    merged = merged_map.read_text()
    assert f"{key_digest(LIMITED)} 20 4 limited\n" in merged
    # HAProxy restarts (reloads) on a config Ray wrote anew; one already shielded stays as is.
    assert _wrap(cfg, environ).count("llmserve-shield") == 1
    # Nothing from a folder others may write to (HAProxy would run what they put there).
    (tmp_path / "shield").chmod(0o777)
    cfg.write_text(CONFIG.format(metrics=1, port=2, backend=3))
    assert "llmserve-shield" not in _wrap(cfg, environ)
    (tmp_path / "shield").chmod(0o700)
    # Without maps (the shield off in every app), the config is Ray's.
    for m in (tmp_path / "shield" / "apps").iterdir():
        m.unlink()
    cfg.write_text(CONFIG.format(metrics=1, port=2, backend=3))
    assert "llmserve-shield" not in _wrap(cfg, environ)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Router(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def haproxy(tmp_path):
    """HAProxy through the wrapper, a limited key's map published; yields its client."""
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    directory, factor = _directory()
    environ = {SHIELD_DIR_ENV: str(tmp_path / "shield")}
    shield.publish(directory, factor, "app1", environ)
    port = _free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(CONFIG.format(metrics=_free_port(), port=port, backend=backend.server_port))
    env = {**os.environ, **environ, "LLMSERVE_HAPROXY_REAL": cluster_env()["LLMSERVE_HAPROXY_REAL"]}
    proc = subprocess.Popen(["sh", str(WRAPPER), "-db", "-f", str(cfg)], env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
    try:
        for _ in range(100):
            try:
                client.get("/")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
        backend.shutdown()


def _statuses(client: httpx.Client, key: str | None, n: int, method: str = "POST") -> list[int]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return [
        client.request(method, "/v1/completions", headers=headers).status_code for _ in range(n)
    ]


def test_haproxy_refuses_a_flood_beyond_the_keys_limit_openai_shaped(haproxy):
    statuses = _statuses(haproxy, LIMITED, 30)
    # 10 a second pass (one more where HAProxy's sliding count rounds down), the rest are 429.
    assert 10 <= statuses.count(200) <= 11 and statuses.count(429) == 30 - statuses.count(200)
    r = haproxy.post("/v1/completions", headers={"authorization": f"Bearer {LIMITED}"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.headers["x-llmserve-refused-by"] == "shield"
    assert r.headers["x-llmserve-tenant"] == "limited"
    assert r.headers["x-ratelimit-limit-requests"] == "4"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    error = json.loads(r.text)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    # Other keys, a wrong key (the Router's 401) and reads are not the flood's.
    assert _statuses(haproxy, OTHER, 30) == [200] * 30
    assert _statuses(haproxy, "sk-wrong-key", 30) == [200] * 30
    assert _statuses(haproxy, LIMITED, 5, method="GET") == [200] * 5


def test_haproxy_never_refuses_what_the_bucket_admits(haproxy):
    # The most the `limited` bucket admits: its burst of 4 at once, then one a second.
    statuses = _statuses(haproxy, LIMITED, 4)
    for _ in range(4):
        time.sleep(1.0)
        statuses += _statuses(haproxy, LIMITED, 1)
    assert statuses == [200] * 8
    assert _statuses(haproxy, None, 5) == [200] * 5  # the anonymous tenant: limit 10
