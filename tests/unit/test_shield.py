"""The shield (llmserve/router/shield.py): each key's limit, the files a Router leaves for HAProxy
in its node's folder, and what llmserve/edge/haproxy_loopback.sh splices from them into the config
Ray writes; two clusters on the machine at once, and one that is gone, keep their limits apart.
The real HAProxy with them: test_shield_haproxy.py."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from llmserve.config.app_config import AppConfig, key_digest
from llmserve.edge.ray_env import (
    HAPROXY_CONFIG_ENV,
)
from llmserve.router import shield
from llmserve.router.tenancy import TenantDirectory

WRAPPER = Path(__file__).resolve().parents[2] / "llmserve" / "edge" / "haproxy_loopback.sh"
LIMITED, OTHER, FROM_ENV = "sk-limited-0000", "sk-unlimited-1111", "sk-limited-env-2222"
NODE = "a" * 56  # a node id, as Ray's: 56 hex digits
HAPROXY_ON = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}


def _env(run: Path) -> dict[str, str]:
    """A cluster's environment as far as the shield reads it: HAProxy on, its files in `run`."""
    return {**HAPROXY_ON, HAPROXY_CONFIG_ENV: str(run / "haproxy.cfg")}


def _config(environ: dict[str, str], node: str, **ports: int) -> Path:
    """HAProxy's config where Ray writes it for `node`: `<run dir>/<node id>/haproxy.cfg`."""
    cfg = Path(environ[HAPROXY_CONFIG_ENV]).parent / node / "haproxy.cfg"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(CONFIG.format(**({"metrics": 1, "port": 2, "backend": 3} | ports)))
    return cfg


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
    environ = _env(tmp_path / "run")
    app_map = shield.publish(directory, factor, "app1", environ, NODE)
    folder = tmp_path / "run" / NODE / "shield"  # beside the config Ray writes for this node
    assert app_map == folder / "apps" / "app1.map"
    text = app_map.read_text()
    assert f"{key_digest(LIMITED)} 10 4 limited\n" in text
    assert LIMITED not in text and FROM_ENV not in text  # digests only
    assert stat.S_IMODE(app_map.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "run" / NODE).stat().st_mode) == 0o700
    assert str(folder / "shield.map") in (folder / "rules.cfg").read_text()
    off, _ = _directory(factor=0)
    shield.publish(off, 0, "app1", environ, NODE)
    assert not app_map.exists()
    # Serve runs no HAProxy: nothing to write, nowhere.
    assert shield.publish(directory, factor, "app1", {HAPROXY_CONFIG_ENV: "/x/h.cfg"}, NODE) is None
    # Without the platform's paths, beside Ray's default config (a pod's own /tmp).
    assert shield.folder(HAPROXY_ON, NODE) == Path("/tmp/haproxy-serve", NODE, "shield")


def test_a_folder_others_can_write_to_is_refused(tmp_path):
    directory, factor = _directory()
    environ = _env(tmp_path / "run")
    folder = tmp_path / "run" / NODE / "shield"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    with pytest.raises(PermissionError, match="not a folder of this user's alone"):
        shield.publish(directory, factor, "app1", environ, NODE)
    assert not (folder / "rules.cfg").exists()
    # Nor under a run dir any user may write to (they could swap the node's folder).
    folder.chmod(0o700)
    (tmp_path / "run").chmod(0o777)
    with pytest.raises(PermissionError, match="not a folder of this user's alone"):
        shield.publish(directory, factor, "app1", environ, NODE)
    assert not (folder / "rules.cfg").exists()


def test_a_run_dir_of_another_users_is_refused(tmp_path, monkeypatch):
    directory, factor = _directory()
    (tmp_path / "run").mkdir(mode=0o700)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # the folder is now another user's
    with pytest.raises(PermissionError, match="not a folder of this user's alone"):
        shield.publish(directory, factor, "app1", _env(tmp_path / "run"), NODE)
    assert not list((tmp_path / "run" / NODE / "shield").rglob("*.map"))


def _wrap(cfg: Path) -> str:
    """The wrapper on `cfg` as Ray runs it (the shield found beside the config, not through the
    environment), the real binary left out: the config it leaves."""
    env = {**os.environ, "LLMSERVE_HAPROXY_REAL": "/bin/true"}  # edit, start nothing
    subprocess.run(["sh", str(WRAPPER), "-db", "-f", str(cfg)], env=env, check=True)
    return cfg.read_text()


def _spliced_map(config: str) -> Path:
    """The merged map the shield's rules in `config` read."""
    (path,) = set(re.findall(r",map\(([^)]+)\)", config))
    return Path(path)


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
    acl is_app2 path_beg /app2
    use_backend http-app2 if is_app2
    use_backend http-app1 if is_app1
    default_backend default_backend
backend default_backend
    http-request return status 404
backend http-app1
    server r1 127.0.0.1:{backend}
backend http-app2
    server r1 127.0.0.1:{backend}
backend http-llmserve
    server r1 127.0.0.1:{backend}
"""


def test_the_wrapper_merges_the_apps_maps_and_puts_the_rules_before_the_backends(tmp_path):
    directory, factor = _directory()
    environ = _env(tmp_path / "run")
    shield.publish(directory, factor, "app1", environ, NODE)
    shield.publish(directory, factor, "app2", environ, NODE)  # one key in two apps: limits add
    cfg = _config(environ, NODE)
    lines = [line.strip() for line in _wrap(cfg).splitlines()]
    assert (
        lines.index("frontend http_frontend")
        < lines.index(
            "# llmserve-shield (llmserve/router/shield.py): a key's requests over its limit"
        )
        < lines.index("use_backend http-app2 if is_app2")
    )
    folder = tmp_path / "run" / NODE / "shield"
    merged_map = folder / "shield.map"
    assert stat.S_IMODE(merged_map.stat().st_mode) == 0o600
    merged = merged_map.read_text()
    assert f"{key_digest(LIMITED)} 20 4 limited\n" in merged
    # HAProxy restarts (reloads) on a config Ray wrote anew; one already shielded stays as is.
    assert _wrap(cfg).count("llmserve-shield") == 1
    # Nothing from a folder others may write to (HAProxy would run what they put there), nor
    # from under a run dir any user may write to.
    for f in (folder, folder / "apps", tmp_path / "run"):
        f.chmod(0o777)
        _config(environ, NODE)
        assert "llmserve-shield" not in _wrap(cfg), f
        f.chmod(0o700)
    # Ray made the node's folder under the user's umask: the wrapper narrows it to 0700 (its
    # admin socket is mode 666), then splices.
    (tmp_path / "run" / NODE).chmod(0o775)
    _config(environ, NODE)
    assert "llmserve-shield" in _wrap(cfg)
    assert stat.S_IMODE((tmp_path / "run" / NODE).stat().st_mode) == 0o700
    # Without maps (the shield off in every app), the config is Ray's.
    for m in (folder / "apps").iterdir():
        m.unlink()
    _config(environ, NODE)
    assert "llmserve-shield" not in _wrap(cfg)


def _without_app(cfg: Path, app: str) -> Path:
    """The config as Ray writes it again once `app` is deleted: no backend, no route to it."""
    text = re.sub(rf"(?m)^backend http-{app}\n(    .*\n)*", "", cfg.read_text())
    cfg.write_text(re.sub(rf"(?m)^    use_backend http-{app} .*\n", "", text))
    return cfg


def test_an_app_deleted_from_the_cluster_no_longer_sets_limits(tmp_path):
    directory, factor = _directory()
    environ = _env(tmp_path / "run")
    for app in ("app1", "app2"):
        shield.publish(directory, factor, app, environ, NODE)
    cfg = _config(environ, NODE)
    assert f"{key_digest(LIMITED)} 20 4 limited\n" in _spliced_map(_wrap(cfg)).read_text()
    # `serve.delete("app2")` leaves its map; Ray writes the config again and reloads.
    cfg = _without_app(_config(environ, NODE), "app2")
    assert f"{key_digest(LIMITED)} 10 4 limited\n" in _spliced_map(_wrap(cfg)).read_text()
    # Every app gone: the config is Ray's.
    cfg = _without_app(_without_app(_config(environ, NODE), "app1"), "app2")
    assert "llmserve-shield" not in _wrap(cfg)


def test_the_map_is_named_as_ray_names_the_apps_backend():
    assert shield.backend_safe_name("llmserve") == "llmserve"
    assert shield.backend_safe_name("team a/chat#2") == "team_a.chat-2"
    assert shield.backend_safe_name("x  y") == "x_y"


def test_the_wrapper_splices_its_own_nodes_map_of_two_clusters_at_once(tmp_path):
    # Two clusters on the machine (say `make serve` and the test suite's), each with an app
    # named `llmserve` that knows the same key, at limits 10 and 20.
    clusters = [(_env(tmp_path / "run"), NODE), (_env(tmp_path / "run-18001"), "b" * 56)]
    for (environ, node), factor in zip(clusters, (2, 4)):
        shield.publish(*_directory(factor), "llmserve", environ, node)
    for (environ, node), limit in zip(clusters, (10, 20)):
        merged = _spliced_map(_wrap(_config(environ, node)))
        assert f"{key_digest(LIMITED)} {limit} 4 limited\n" in merged.read_text()
        assert f"{shield.ANONYMOUS} {limit} 2 anonymous\n" in merged.read_text()
        assert merged == Path(environ[HAPROXY_CONFIG_ENV]).parent / node / "shield" / "shield.map"


def test_a_map_a_gone_cluster_left_is_not_merged_into_a_new_nodes_config(tmp_path):
    # A cluster that is gone without `make stop` left its maps (the demo's limits, factor 4) in
    # the same run dir; the next one has a new node id.
    environ = _env(tmp_path / "run")
    gone, new = NODE, "c" * 56
    shield.publish(*_directory(4), "llmserve", environ, gone)
    # HAProxy starts before the new cluster's Router publishes: nothing of the gone one's.
    cfg = _config(environ, new)
    assert "llmserve-shield" not in _wrap(cfg)
    assert not (tmp_path / "run" / new / "shield" / "shield.map").exists()
    # Then the new Router's map, and only its limits.
    shield.publish(*_directory(2), "llmserve", environ, new)
    _config(environ, new)
    merged = _spliced_map(_wrap(cfg)).read_text()
    assert f"{key_digest(LIMITED)} 10 4 limited\n" in merged and " 20 " not in merged
