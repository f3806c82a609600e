"""The shield in the real HAProxy (the binary Ray bundles), started through
llmserve/edge/haproxy_loopback.sh on the files a Router leaves (test_shield.py), in front of a plain
HTTP server standing in for the Routers: a flood refused OpenAI-shaped, never what the bucket
admits, and two clusters at once each at its own limit."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llmserve.edge.ray_env import (
    cluster_env,
    path_env,
    remove_cluster_files,
    run_dir,
)
from llmserve.router import shield
from llmserve.router.request_path import edge_wait_s
from tests.unit.test_shield import (
    HAPROXY_ON,
    LIMITED,
    NODE,
    OTHER,
    WRAPPER,
    _config,
    _directory,
    _env,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Router(BaseHTTPRequestHandler):
    def do_POST(self):
        self.server.stamps.append(self.headers.get(shield.EDGE_HEADER))
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def backend() -> Iterator[ThreadingHTTPServer]:
    """A plain HTTP server standing in for the Routers."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    server.stamps = []  # the edge stamps the requests came with
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@contextlib.contextmanager
def _running(cfg: Path, port: int) -> Iterator[httpx.Client]:
    """The real HAProxy through the wrapper on `cfg`; a client of its API `port` once it
    answers."""
    env = {**os.environ, "LLMSERVE_HAPROXY_REAL": cluster_env()["LLMSERVE_HAPROXY_REAL"]}
    proc = subprocess.Popen(["sh", str(WRAPPER), "-db", "-f", str(cfg)], env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
    try:
        for _ in range(100):
            try:
                client.get("/")
                break
            except httpx.TransportError:
                assert proc.poll() is None, f"HAProxy on {cfg} exited {proc.returncode}"
                time.sleep(0.05)
        else:
            raise AssertionError(f"HAProxy on {cfg} never answered")
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def haproxy(tmp_path, backend):
    """HAProxy through the wrapper, a limited key's map published; yields its client."""
    environ = _env(tmp_path / "run")
    shield.publish(*_directory(), "app1", environ, NODE)
    port = _free_port()
    cfg = _config(environ, NODE, metrics=_free_port(), port=port, backend=backend.server_port)
    with _running(cfg, port) as client:
        yield client


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


def test_two_clusters_at_once_each_haproxy_refuses_at_its_own_limit(backend):
    # As cluster_env lays two clusters out on this machine (their run dirs under /tmp, the node
    # folders Ray makes, each HAProxy's admin socket where Ray's template puts it), each with
    # an app named `llmserve` that knows the same key: limits 10 and 20. Both Routers publish,
    # then both HAProxys (re)start, as Ray restarts one whenever it rewrites its config.
    bases = [_free_port(), _free_port()]
    clusters = [({**HAPROXY_ON, **path_env(b)}, secrets.token_hex(28)) for b in bases]
    try:
        for (environ, node), factor in zip(clusters, (2, 4)):
            shield.publish(*_directory(factor), "llmserve", environ, node)
        with contextlib.ExitStack() as stack:
            clients = []
            for environ, node in clusters:
                port = _free_port()
                cfg = _config(
                    environ, node, metrics=_free_port(), port=port, backend=backend.server_port
                )
                sock = Path(environ["RAY_SERVE_HAPROXY_SOCKET_PATH"])
                sock = sock.parent / node / sock.name  # where Ray puts it for this node
                cfg.write_text(
                    f"global\n    stats socket {sock} mode 666 level admin expose-fd listeners\n"
                    + cfg.read_text()
                )
                clients.append(stack.enter_context(_running(cfg, port)))
            first, second = (_statuses(c, LIMITED, 30) for c in clients)
        assert 10 <= first.count(200) <= 11 and first.count(429) == 30 - first.count(200)
        assert 20 <= second.count(200) <= 21 and second.count(429) == 30 - second.count(200)
    finally:
        for base in bases:
            assert remove_cluster_files(base) == [run_dir(base)]


def test_haproxy_stamps_each_request_with_when_it_passed_it_on(haproxy, backend):
    """The Router counts the time since against the request's first-token promise
    (request_path.edge_wait_s); a client's own stamp is replaced, not passed on."""
    before = time.time()
    forged = {
        "authorization": f"Bearer {OTHER}",
        shield.EDGE_HEADER: str(int(before * 1e6) - 10**8),
    }
    assert haproxy.post("/v1/completions", headers=forged).status_code == 200
    after = time.time()
    stamp = backend.stamps[-1]
    assert before <= int(stamp) / 1e6 <= after, (before, stamp, after)
    assert 0 <= edge_wait_s(stamp, after + 0.25) - 0.25 <= after - before
