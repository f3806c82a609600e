"""What `make serve` exposes: started as the README says (the Makefile's own recipe, on ports of
its own), the platform's processes listen on loopback only, but for Serve's gRPC servers between
replicas, and those refuse a call without Ray's token (token auth is on) and take one with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from tests.integration.helpers import cluster_processes

ROOT = Path(__file__).resolve().parents[2]
# Above Ray's worker port range (10002-19999), which its own checks keep clear.
PORTS = {"RAY_PORT": 21379, "DASHBOARD_PORT": 21265, "METRICS_PORT": 21080}
HTTP_PORT = 21000
CONFIG = f"""
proxy_location: HeadOnly
http_options: {{host: 127.0.0.1, port: {HTTP_PORT}}}
applications:
  - name: llmserve
    route_prefix: /
    import_path: llmserve.app:build_app
    args:
      models: [{{name: sim, source: simulated}}]
      tenants: [{{name: t, api_keys: [sk-exposure-test-01]}}]
"""
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
pytestmark = pytest.mark.timeout(900)


def listeners(procs: list[psutil.Process]) -> list[tuple[str, int, str]]:
    out = []
    for p in procs:
        try:
            name = " ".join(p.cmdline())[:60] or p.name()
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.append((c.laddr.ip, c.laddr.port, name))
        except psutil.Error:
            continue
    return out


def grpc_code(port: int, token: str | None) -> grpc.StatusCode:
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        # A method the server has (an unknown one is UNIMPLEMENTED before any check), with an
        # empty request: what matters is whether the token check lets it through.
        call = channel.unary_unary("/ray.serve.ASGIService/HandleRequest")
        try:
            call(b"", metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def make_serve():
    # Short: Ray's socket paths under it must stay below the 107-byte limit of AF_UNIX.
    tmp = tempfile.mkdtemp(prefix="/tmp/lexp-")
    config = Path(tmp) / "exposure.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_TMPDIR"] = tmp
    log = open(Path(tmp) / "make-serve.log", "wb")
    make = subprocess.Popen(
        ["make", "serve", f"CONFIG={config}", *(f"{k}={v}" for k, v in PORTS.items())],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{HTTP_PORT}/v1/completions",
                    headers={"Authorization": "Bearer sk-exposure-test-01"},
                    json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                    timeout=10,
                )
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            tail = (Path(tmp) / "make-serve.log").read_text(errors="replace")[-3000:]
            assert make.poll() is None, f"make serve exited:\n{tail}"
            assert time.monotonic() < deadline, f"make serve did not come up:\n{tail}"
            time.sleep(2)
        time.sleep(5)  # every replica's servers up
        yield tmp
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        procs = cluster_processes(tmp)
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        # Ray's GCS and autoscaler monitor outwait a SIGTERM by 30 s and more (seen): the
        # cluster is a throwaway, so they get 10 s, then SIGKILL.
        _, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def test_make_serve_listens_beyond_loopback_only_behind_token_auth(make_serve):
    found = listeners(cluster_processes(make_serve))
    assert any(port == HTTP_PORT for _, port, _ in found), found  # the API, on loopback
    wide = [(ip, port, name) for ip, port, name in found if ip not in LOOPBACK]
    print(f"\n{len(found)} listening sockets; beyond loopback: {wide}")
    # Ray's single-machine mode puts every Ray service on loopback; what Serve binds wider is
    # its gRPC server between replicas, and Ray's token guards it.
    assert all("ServeReplica" in name for _, _, name in wide), wide
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    for _, port, _ in wide:
        assert grpc_code(port, None) == grpc.StatusCode.UNAUTHENTICATED, port
        assert grpc_code(port, "not-the-token") == grpc.StatusCode.UNAUTHENTICATED, port
        assert grpc_code(port, token) != grpc.StatusCode.UNAUTHENTICATED, port  # past the guard
    # The dashboard (it submits jobs) answers only with the token, too.
    dashboard = f"http://127.0.0.1:{PORTS['DASHBOARD_PORT']}/api/version"
    assert httpx.get(dashboard, timeout=30).status_code == 401
