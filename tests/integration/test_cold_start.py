"""A model scaled to zero keeps its classes' promises, on the real stack (Ray Serve's autoscaling,
the Router, a replica of the simulated engine): a standard request, whose 2 s first-token promise
a replica's start (`replica_start_s`, 30 s here) would break, is refused at once with 503
`cold_start` and a Retry-After of the start, and the start begins all the same (the Router's
handle call, llmserve/router/wake.py), so that the client's retry finds a replica. A batch
request, promised only its deadline, is held while the replica starts (unit tests:
tests/unit/test_gate_replicas.py)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.apps import CALL_TIMEOUT_S, SHIPPED_ADMISSION

APP, PREFIX, MODEL = "cold", "/cold", "sim-cold"
KEY = "sk-test-cold-standard-0001"
START_S = 30
IDLE_TO_ZERO_S = 2  # the app starts one replica; idle this long, the model goes to zero
ROUTER_LOOK_S = 5  # the Router refreshes its replica counts every 2 s (router.py)
UP_WITHIN_S = 180  # a Serve replica of the simulated engine: seconds on a quiet host
pytestmark = pytest.mark.timeout(600)


def cold_args() -> dict:
    return {
        "router": {"num_replicas": 1, "num_cpus": 0.25},
        "models": [
            {
                "name": MODEL,
                "source": "simulated",
                "deployment": {
                    "num_cpus": 0.25,
                    "autoscaling": {
                        "min_replicas": 0,
                        "max_replicas": 1,
                        "replica_start_s": START_S,
                        "scale_to_zero_after_s": IDLE_TO_ZERO_S,
                    },
                },
            }
        ],
        "admission": SHIPPED_ADMISSION,
        "tenants": [{"name": "cold-standard", "api_keys": [KEY], "priority": "standard"}],
    }


@pytest.fixture(scope="module")
def cold_url(serve_cluster):
    from ray import serve

    from llmserve.app import build_app

    serve.run(build_app(cold_args()), name=APP, route_prefix=PREFIX)
    yield serve_cluster + PREFIX
    serve.delete(APP)


def running_replicas() -> int:
    from ray import serve

    status = serve.status().applications[APP].deployments[f"llm-{MODEL}"]
    return status.replica_states.get("RUNNING", 0)


def test_a_cold_start_longer_than_the_promise_is_refused_at_once_and_begun(cold_url):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=cold_url, timeout=CALL_TIMEOUT_S) as client:
        # Ray Serve starts one replica (initial_replicas); idle, the model goes to zero.
        deadline = time.monotonic() + UP_WITHIN_S
        while running_replicas() != 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert running_replicas() == 0, "the idle model did not scale to zero"
        # The Router learns the count at its next look (llmserve/protocol/route_note.py).
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(ROUTER_LOOK_S)
        t0 = time.monotonic()
        r = client.post("/v1/completions", json=body, headers=headers)
        took_s = time.monotonic() - t0
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "cold_start"
        assert 1 <= int(r.headers["retry-after"]) <= START_S
        assert took_s < 5, f"the refusal took {took_s:.1f} s"  # at once, not after a wait
        # No request waits at the handle, yet a replica starts: the Router woke the model.
        deadline = time.monotonic() + UP_WITHIN_S
        while running_replicas() == 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert running_replicas() == 1, "the refused request started no replica"
        # The client's retry is served (the Router learns of the replica within seconds).
        deadline = time.monotonic() + 60
        while (r := client.post("/v1/completions", json=body, headers=headers)).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(1)
        # Served once, the model's request router writes each change of its replica set into
        # the Router's counts (the controller is no longer asked): idle again, it goes to zero
        # and the Router hears so from Ray's push, and refuses the next request the same way.
        deadline = time.monotonic() + UP_WITHIN_S
        while running_replicas() != 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert running_replicas() == 0, "the idle model did not scale to zero again"
        time.sleep(ROUTER_LOOK_S)
        r = client.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 503 and r.json()["error"]["code"] == "cold_start", r.text
