"""llmserve/edge/ray_env.py: each cluster's HAProxy files in a run dir of its own, which Ray reads
from the names it sets, whose sockets fit a unix socket's path, and which `make stop` removes
(`remove_cluster_files`) when it is this user's folder, and only then."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from llmserve.edge import ray_env
from llmserve.edge.ray_env import (
    HAPROXY_CONFIG_ENV,
    RAY_HAPROXY_CONFIG_DEFAULT,
    cluster_env,
    path_env,
    remove_cluster_files,
    run_dir,
)

NODE = "f" * 56  # a node id, as Ray's: 56 hex digits


def test_each_cluster_has_its_haproxy_files_in_a_run_dir_of_its_own():
    uid = os.getuid()
    assert run_dir() == f"/tmp/llmserve-{uid}"
    assert run_dir(18001) == f"/tmp/llmserve-{uid}-18001"
    for port_base in (None, 18001):
        env, d = cluster_env(port_base), run_dir(port_base)
        assert path_env(port_base).items() <= env.items()
        assert env[HAPROXY_CONFIG_ENV] == f"{d}/haproxy.cfg"
        assert env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] == d
        assert all(v.startswith(d) for v in path_env(port_base).values())
    assert cluster_env(18001)[HAPROXY_CONFIG_ENV] != cluster_env()[HAPROXY_CONFIG_ENV]


def test_ray_reads_these_names_and_its_default_is_the_one_the_shield_falls_back_on():
    names = sorted(path_env())
    code = (
        "import json, sys; from ray.serve._private import constants as c; "
        f"print(json.dumps([getattr(c, n) for n in {names!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in names}
    ray_defaults = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert ray_defaults[names.index(HAPROXY_CONFIG_ENV)] == RAY_HAPROXY_CONFIG_DEFAULT
    ours = json.loads(
        subprocess.run(
            [sys.executable, "-c", code],
            env={**env, **path_env(18001)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert ours == [path_env(18001)[n] for n in names]


def test_haproxys_sockets_fit_a_unix_sockets_path(monkeypatch):
    # HAProxy 2.8 refuses an admin socket's path over 97 characters ("socket path '...' too
    # long (max 97)", checked by hand with the binary Ray bundles); the metrics socket, which
    # Ray's Python binds, fits 107. With a uid of up to 9 digits and a port base of 5.
    for uid in (os.getuid(), 999_999_999):
        monkeypatch.setattr(os, "getuid", lambda uid=uid: uid)
        env = path_env(65535)
        for name, most in (
            ("RAY_SERVE_HAPROXY_SOCKET_PATH", 97),
            ("RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH", 107),
        ):
            d, f = os.path.split(env[name])
            assert len(os.path.join(d, NODE, f)) <= most, (uid, name)


def test_remove_cluster_files_removes_the_run_dir(tmp_path, monkeypatch):
    run = tmp_path / "llmserve-run"
    monkeypatch.setattr(ray_env, "run_dir", lambda port_base=None: str(run))
    (run / NODE / "shield" / "apps").mkdir(parents=True)
    (run / NODE / "haproxy.cfg").write_text("")
    (run / NODE / "shield" / "apps" / "llmserve.map").write_text("")
    (run / NODE / "shield").chmod(0o700)
    assert remove_cluster_files(18001) == [str(run)]
    assert not run.exists()
    assert remove_cluster_files(18001) == []  # nothing left to remove


def test_remove_cluster_files_leaves_what_is_not_this_users_folder(tmp_path, monkeypatch, capsys):
    run = tmp_path / "llmserve-run"
    monkeypatch.setattr(ray_env, "run_dir", lambda port_base=None: str(run))
    # A link to a folder of ours: the link is not the run dir, and what it points at stays.
    target = tmp_path / "elsewhere"
    (target / NODE).mkdir(parents=True)
    run.symlink_to(target)
    assert remove_cluster_files() == []
    assert run.is_symlink() and (target / NODE).is_dir()
    # Another user's folder.
    run.unlink()
    (run / NODE).mkdir(parents=True)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    assert remove_cluster_files() == []
    assert (run / NODE).is_dir()
    assert capsys.readouterr().err.count("not a folder of this user's") == 2
