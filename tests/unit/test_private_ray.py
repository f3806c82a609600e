"""bench/private_ray.py's order of things, against a stand-in for Ray (no Ray starts): the
platform's environment and the caller's before Ray is imported, the callers' ray.init options,
Serve on the loopback port, and Serve then Ray shut down however the block ends, then the
cluster's HAProxy and shield files removed."""

from __future__ import annotations

import os
import signal
import sys
import types

import pytest

from bench import private_ray as pr


@pytest.fixture
def calls(monkeypatch) -> list:
    """What the stand-in Ray, Serve and build_app were asked, in order."""
    log: list = []
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(
        "llmserve.edge.ray_env.apply", lambda port_base: log.append(("ray_env", port_base))
    )
    monkeypatch.setattr(
        "llmserve.edge.ray_env.remove_cluster_files",
        lambda port_base: log.append(("remove_cluster_files", port_base)) or [],
    )
    ray = types.ModuleType("ray")

    def init(**kwargs):
        log.append(("init", os.environ.get("VARIANT"), kwargs))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as ray.init replaces it

    ray.init = init
    ray.shutdown = lambda: log.append(("ray.shutdown",))
    serve = types.SimpleNamespace(
        start=lambda http_options: log.append(("serve.start", http_options)),
        run=lambda app, name, route_prefix: log.append(("serve.run", app, name, route_prefix)),
        shutdown=lambda: log.append(("serve.shutdown",)),
    )
    ray.serve = serve
    app = types.ModuleType("llmserve.app")
    app.build_app = lambda args: ("app", args["n"])
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.setitem(sys.modules, "llmserve.app", app)
    return log


def test_the_environment_comes_first_and_serve_and_ray_stop_last(calls):
    with pr.private_ray(18500, env={"VARIANT": "1"}) as ray_app:
        ray_app.deploy({"n": 1}, name="bench")
        assert ray_app.url == "http://127.0.0.1:18500"
    assert calls == [
        ("ray_env", 18501),
        ("init", "1", {"num_cpus": 8, "include_dashboard": False, "log_to_driver": False}),
        ("serve.start", {"host": "127.0.0.1", "port": 18500}),
        ("serve.run", ("app", 1), "bench", "/"),
        ("serve.shutdown",),
        ("ray.shutdown",),
        ("remove_cluster_files", 18501),  # the run dir its environment named
    ]


def test_a_private_instance_with_its_own_options_and_handler(calls, monkeypatch):
    reaped: list = []
    monkeypatch.setattr(pr, "reap", reaped.append)

    def interrupt(signum, frame):
        pass

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            with pr.private_ray(
                18510,
                platform_env=False,
                new_instance=True,
                temp_dir="/tmp/x",
                metrics_export_port=18080,
                system_config={"a": 1},
                interrupt=interrupt,
                reap_leftovers=True,
            ):
                assert signal.getsignal(signal.SIGTERM) is interrupt
                assert signal.getsignal(signal.SIGINT) is interrupt
                raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert calls[0] == (
        "init",
        None,
        {
            "num_cpus": 8,
            "include_dashboard": False,
            "log_to_driver": False,
            "address": "local",
            "_temp_dir": "/tmp/x",
            "_metrics_export_port": 18080,
            "_system_config": {"a": 1},
        },
    )
    assert calls[-2:] == [("serve.shutdown",), ("ray.shutdown",)]  # no platform env: no files
    assert len(reaped) == 1 and isinstance(reaped[0], list)  # this process's children
