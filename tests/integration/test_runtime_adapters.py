"""A LoRA adapter added to a running app's config, on the real engine through Ray Serve's own
declarative deploy (what `serve deploy serve_config.yaml` does): the deployment's user_config
changes, the running replica loads the adapter into its engine without a restart, the Router
serves its name on the first request and lists it; an adapter from an installed package
(`pypi:`) loads beside it; an adapter that cannot load leaves the others serving; a removed one
is answered 404."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import ray
from ray import serve
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from chaos.watch import REPLICA_PREFIX
from llmserve.router import served_table
from tests.integration.apps import CALL_TIMEOUT_S, ENGINE_READY_S, OPEN_ACCESS, TINY
from tests.integration.helpers import tiny_engine, wait_running

pytestmark = pytest.mark.timeout(3 * ENGINE_READY_S)

APP, PREFIX, NAME = "runtime-adapters", "/runtime-adapters", "tiny-runtime"
DEPLOYMENT = f"llm-{NAME}"
ADAPTER = "tiny-runtime-lora"
PACKAGED = "tiny-runtime-packaged"  # from the package below
PACKAGE = "llmserve-test-adapter"  # a package on the replica's PYTHONPATH holding an adapter
# A tiny adapter builds and loads in ~1 s here; a slow CI hour is ~3x slower than a quiet one.
ADAPTER_READY_S = 120


def deploy(model_dirs, site: Path, adapters: list[dict]) -> None:
    """The app as a config file would give it, its model's user_config naming `adapters`."""
    args = {
        **OPEN_ACCESS,
        "models": [
            {
                "name": NAME,
                "source": str(model_dirs[TINY]),
                "engine": tiny_engine(4),
                "deployment": {
                    "num_replicas": 1,
                    "num_cpus": 0.5,
                    "env_vars": {"PYTHONPATH": str(site)},
                },
                "lora": {"max_lora_rank": 8},  # LoRA on, no adapter at start
            }
        ],
    }
    app = ServeApplicationSchema(
        name=APP,
        route_prefix=PREFIX,
        import_path="llmserve.app:build_app",
        args=args,
        deployments=[{"name": DEPLOYMENT, "user_config": {"adapters": adapters}}],
    )
    serve.context._get_global_client().deploy_apps(ServeDeploySchema(applications=[app]))
    # The controller builds the app in a task of its own; its deployments appear once built.
    deadline = time.monotonic() + ENGINE_READY_S
    while time.monotonic() < deadline:
        status = serve.status().applications.get(APP)
        assert status is None or status.status != "DEPLOY_FAILED", status.message
        if status is not None and DEPLOYMENT in status.deployments:
            return
        time.sleep(0.5)
    raise AssertionError(f"{APP} not built within {ENGINE_READY_S} s")


def replica_pids() -> dict[str, int]:
    prefix = f"{REPLICA_PREFIX}{APP}#{DEPLOYMENT}#"
    return {
        a["Name"]: a["Pid"]
        for a in ray._private.state.actors().values()
        if a["Name"].startswith(prefix) and a["State"] == "ALIVE"
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_dirs) -> Path:
    """A folder of installed packages holding one: an adapter's files beside its __init__.py."""
    from llmserve.planning.adapters import build_random_lora

    root = tmp_path_factory.mktemp("site")
    package = root / PACKAGE.replace("-", "_")
    build_random_lora(package, str(model_dirs[TINY]), seed=9)
    (package / "__init__.py").write_text("")
    return root


@pytest.fixture(scope="module")
def url(serve_cluster, model_dirs, site):
    deploy(model_dirs, site, [])
    try:
        wait_running(APP, [DEPLOYMENT], replicas=1)
        yield f"{serve_cluster}{PREFIX}"
    finally:
        serve.delete(APP)


def chat(url: str, model: str) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 12,
        "temperature": 0,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=CALL_TIMEOUT_S)


def listed(url: str) -> dict[str, str | None]:
    data = httpx.get(f"{url}/v1/models", timeout=CALL_TIMEOUT_S).json()["data"]
    return {m["id"]: m.get("parent") for m in data}


def test_an_adapter_added_to_the_config_serves_without_a_restart(url, model_dirs, site, tmp_path):
    base = chat(url, NAME)
    assert base.status_code == 200, base.text
    unknown = chat(url, ADAPTER)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    before = replica_pids()
    assert len(before) == 1

    # The new adapter, and one whose folder is no adapter: it is left out, the first loads.
    (tmp_path / "empty").mkdir()
    broken = {"name": "tiny-runtime-broken", "source": str(tmp_path / "empty")}
    packaged = {"name": PACKAGED, "source": f"pypi:{PACKAGE}"}
    deploy(model_dirs, site, [{"name": ADAPTER, "source": "random:7"}, packaged, broken])
    deadline = time.monotonic() + ADAPTER_READY_S
    while ADAPTER not in listed(url) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert listed(url) == {NAME: None, ADAPTER: NAME, PACKAGED: NAME}
    texts = {base.json()["choices"][0]["message"]["content"]}
    for name in (ADAPTER, PACKAGED):
        answer = chat(url, name)
        assert answer.status_code == 200, answer.text
        texts.add(answer.json()["choices"][0]["message"]["content"])
    assert len(texts) == 3, texts  # greedy: each adapter answers its own, not the base's
    assert chat(url, broken["name"]).status_code == 404
    assert replica_pids() == before, "the replica restarted: its engine did too"
    assert serve.status().applications[APP].status == "RUNNING"

    # Removed from the config: gone from the list within the Router's refresh, then a 404.
    deploy(model_dirs, site, [])
    deadline = time.monotonic() + 4 * served_table.REFRESH_S
    while ADAPTER in listed(url) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert listed(url) == {NAME: None}
    assert chat(url, ADAPTER).status_code == 404
    assert (
        chat(url, NAME).json()["choices"][0]["message"]["content"]
        == (base.json()["choices"][0]["message"]["content"])
    )
    assert replica_pids() == before
