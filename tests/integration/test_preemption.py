"""Preemption through the real Router and replica, on the simulated engine: batch streams hold
every slot of the model, an interactive request arrives, takes the slot of the batch stream
that ran longest (its engine request aborted), and that stream goes on once a slot frees, its
client reading one unbroken answer (llmserve/policies/admission.py, llmserve/policies/resume.py).
The simulated engine numbers its tokens (" tok1", " tok2", ...), so a token lost or repeated
at the break shows in the text."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.client import send
from tests.integration.apps import CLIENT_TIMEOUT_S, KEYS
from tests.integration.helpers import deployed_app

pytestmark = pytest.mark.timeout(300)

NAME, PREFIX = "sim-preempt", "/preempt"
BATCH_TOKENS, STEP_S = 150, 0.02  # a batch answer: ~3 s alone


def app(max_resumes: int) -> dict:
    return {
        "http": {"debug_headers": True},
        "models": [
            {
                "name": NAME,
                "source": "simulated",
                "engine": {"max_model_len": 1024, "max_num_seqs": 2},
                "simulation": {"step_s": STEP_S, "per_seq_step_s": 0},
                "deployment": {"num_replicas": 1, "max_ongoing_requests": 2, "num_cpus": 0.25},
                "routing": {"max_resumes": max_resumes},
            }
        ],
        "admission": {
            "anonymous_tenant": None,
            "batch_max_share": 1.0,  # batch may hold every slot: what preemption is for
            "ttft_objective_s_by_class": {"interactive": 1},
            "max_queue_wait_s_by_class": {"interactive": 30, "batch": 60},
        },
        "tenants": [
            {"name": "interactive", "api_keys": [KEYS["interactive"]], "priority": "interactive"},
            {"name": "batch", "api_keys": [KEYS["batch"]], "priority": "batch"},
        ],
    }


async def _scenario(url: str):
    def body(max_tokens: int) -> dict:
        return {"model": NAME, "prompt": "go", "max_tokens": max_tokens, "stream": True}

    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        # Until the Router has seen the replica running (it queues everything before), so
        # that both batch streams start at once and hold both slots.
        for _ in range(30):
            warm = await send(client, "/v1/completions", body(1), headers=_auth("batch"))
            if warm.status == 200 and warm.ttft_s is not None and warm.ttft_s < 0.5:
                break
        else:
            raise AssertionError(f"the app never answered at once: {warm}")
        batch = [
            asyncio.create_task(
                send(client, "/v1/completions", body(BATCH_TOKENS), headers=_auth("batch"))
            )
            for _ in range(2)
        ]
        await asyncio.sleep(1.0)  # both run, a third of their answers out
        interactive = await send(client, "/v1/completions", body(5), headers=_auth("interactive"))
        return interactive, await asyncio.gather(*batch)


def _auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


WHOLE = "".join(f" tok{i}" for i in range(1, BATCH_TOKENS + 1))


@pytest.mark.parametrize("max_resumes", [2, 0], ids=["preemption", "without"])
def test_interactive_takes_a_batch_slot_and_the_batch_stream_goes_on_unbroken(
    serve_cluster, max_resumes
):
    deployments = [f"llm-{NAME}"]
    with deployed_app(serve_cluster, app(max_resumes), "preempt", PREFIX, deployments, 1) as url:
        interactive, batch = asyncio.run(_scenario(url))
    print(f"\ninteractive {interactive.status}, TTFT {interactive.ttft_s} s; ", end="")
    print(f"batch resumes {[b.resumes for b in batch]}")
    assert all(b.status == 200 and b.done and b.sse_error is None for b in batch), batch
    # Every batch answer whole: not a token lost or repeated where one was preempted.
    assert [b.text for b in batch] == [WHOLE, WHOLE]
    if max_resumes:
        # Its first token at once, not after a batch answer's remaining ~2 s.
        assert interactive.status == 200 and interactive.text == " tok1 tok2 tok3 tok4 tok5"
        assert interactive.ttft_s < 1.0
        assert sorted(b.resumes for b in batch) == [0, 1]
    else:  # the feature off: no engine slot to take, refused at once (503, Retry-After)
        assert interactive.status == 503, interactive
        assert [b.resumes for b in batch] == [0, 0]
