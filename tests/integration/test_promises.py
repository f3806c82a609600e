"""Interactive work beside a batch flood, on the shipped serve_config.yaml (its default model's
entry, its admission and its demo tenants, read from the file): 48 batch streams of 256 tokens
from the demo batch key saturate the engine (max_num_seqs 32), and short requests from the demo
interactive key must still get their first token within a couple of seconds.

Batch holds at most `batch_max_share` of the engine's slots (llmserve/policies/admission.py),
so an interactive request finds a free one. When the share was taken of the Router's 48 slots
(36 for batch), batch held all 32 engine slots and an interactive request waited in vLLM's line
for a 256-token batch answer to end (19 s at the median, measured by hand on the shipped config).
A wave of batch starts is held to a few prefills at a time (`batch_prefill_share`), so an
interactive request arriving just after it does not wait for the whole wave's prefill.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.apps import CLIENT_TIMEOUT_S, DEFAULT, METRICS_PORT

ROOT = Path(__file__).resolve().parents[2]
APP, PREFIX = "promises", "/promises"
BATCH_KEY, INTERACTIVE_KEY = "sk-demo-batch-0001", "sk-demo-interactive-0001"  # README's
NUM_BATCH, BATCH_TOKENS = 48, 256
NUM_INTERACTIVE, INTERACTIVE_TOKENS = 8, 16
STORY = "Tell me a long story about the sea."
# A first token beside the flood: a step or two of the engine with ~25 sequences plus this
# request's prefill (a few hundred ms here; seconds on a slow hour), against ~20 s without the
# reservation.
MAX_TTFT_P50_S = 3.0
# Beside a wave of batch starts, an interactive first token within half the wave's own
# (relative: the host's speed moves both). Measured here (share 0.0625): 0.29-0.60 s against a
# wave of 3.9 s; with every batch prefill admitted at once (`batch_prefill_share: 1`) 2.05-2.52 s
# against 2.84.
WAVE_FRACTION = 0.5
pytestmark = pytest.mark.timeout(900)


def shipped_args() -> dict:
    """The shipped app, its default model alone, without the local demo's anonymous tenant:
    this app's Router leaves its keys' limits in the session cluster's shield, where they stay
    after `serve.delete` until the cluster stops, and the demo's anonymous limit (14 a second)
    would then refuse the other test apps' anonymous traffic at HAProxy."""
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = doc["applications"][0]["args"]
    (model,) = [m for m in args["models"] if m["name"] == DEFAULT]
    tenants = [t for t in args["tenants"] if t["name"] != args["admission"]["anonymous_tenant"]]
    admission = {**args["admission"], "anonymous_tenant": None}
    return {**args, "models": [model], "tenants": tenants, "admission": admission}


@pytest.fixture(scope="module")
def promises_url(serve_cluster, model_dirs):
    from ray import serve

    from llmserve.app import build_app

    serve.run(build_app(shipped_args()), name=APP, route_prefix=PREFIX)
    yield serve_cluster + PREFIX
    serve.delete(APP)


async def _ttft_s(
    client: httpx.AsyncClient, key: str, max_tokens: int, prompt: str = STORY
) -> float | None:
    """Seconds to the first streamed token; None if the request did not stream one."""
    body = {
        "model": DEFAULT,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "timeout": 600,
    }
    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            return None
        first = None
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = time.monotonic() - t0
        return first


async def _scenario(url: str) -> tuple[list[float], list[float | None], int]:
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        idle = [await _ttft_s(client, INTERACTIVE_KEY, INTERACTIVE_TOKENS) for _ in range(3)]
        batch = [
            asyncio.create_task(_ttft_s(client, BATCH_KEY, BATCH_TOKENS)) for _ in range(NUM_BATCH)
        ]
        # The flood settles: every batch request the engine will run has streamed its first
        # token, so the engine's slots that batch may hold are held.
        await asyncio.sleep(10)
        running = sum(1 for t in batch if not t.done())
        beside = []
        for _ in range(NUM_INTERACTIVE):
            beside.append(asyncio.create_task(_ttft_s(client, INTERACTIVE_KEY, INTERACTIVE_TOKENS)))
            await asyncio.sleep(1)
        beside_s = await asyncio.gather(*beside)
        for t in batch:
            t.cancel()
        await asyncio.gather(*batch, return_exceptions=True)
    return [s for s in idle if s is not None], beside_s, running


def test_interactive_first_token_beside_a_batch_flood_on_the_shipped_config(promises_url):
    idle, beside, batch_running = asyncio.run(_scenario(promises_url))
    print(
        f"\nidle TTFT {[round(s, 3) for s in idle]} s; beside {NUM_BATCH} batch streams: "
        f"{[None if s is None else round(s, 3) for s in beside]} s; "
        f"{batch_running} batch requests running or queued when they began"
    )
    assert len(idle) == 3
    assert batch_running == NUM_BATCH, "the batch flood was not there: no test"
    assert all(s is not None for s in beside), beside  # every interactive request served
    assert statistics.median(beside) <= MAX_TTFT_P50_S, beside


def _objective_counts(tenant: str) -> dict[str, float]:
    """llmserve_ttft_objective_total of one tenant on the promises app, by result."""
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=30).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ray_llmserve_ttft_objective_total{") and f'tenant="{tenant}"' in line:
            result = line.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = counts.get(result, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_the_class_s_first_token_promise_is_counted(promises_url):
    # The shipped config promises interactive work its first token within 1 s: the scenario's
    # idle interactive requests met it (the ones beside the flood may have too).
    deadline = time.monotonic() + 60  # Ray exports application metrics every few seconds
    while (counts := _objective_counts("demo-interactive")).get("met", 0) < 3:
        assert time.monotonic() < deadline, counts
        time.sleep(2)
    assert not _objective_counts("demo-batch"), "batch has a deadline, no first-token promise"


# A wave of batch starts: as many as batch may hold (3/4 of 32 slots), long prompts, sent at once.
NUM_WAVE, WAVE_PROMPT = 24, "Summarize: " + "the sea was calm and the ship sailed on. " * 40


async def _wave_scenario(url: str) -> tuple[list[float], list[float | None], list[float | None]]:
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        idle = [await _ttft_s(client, INTERACTIVE_KEY, INTERACTIVE_TOKENS) for _ in range(3)]
        wave = [
            asyncio.create_task(_ttft_s(client, BATCH_KEY, 8, WAVE_PROMPT)) for _ in range(NUM_WAVE)
        ]
        await asyncio.sleep(0.3)  # the wave reached the Router
        beside = []
        for _ in range(3):
            beside.append(asyncio.create_task(_ttft_s(client, INTERACTIVE_KEY, INTERACTIVE_TOKENS)))
            await asyncio.sleep(0.3)
        return (
            [s for s in idle if s is not None],
            list(await asyncio.gather(*beside)),
            list(await asyncio.gather(*wave)),
        )


def test_interactive_first_token_beside_a_wave_of_batch_starts(promises_url):
    """The engine runs the prefills it admitted before any request waiting: were the whole
    wave admitted at once, an interactive request arriving just after it would wait for all
    of its prefills. `batch_prefill_share` holds batch to a few prefills at a time."""
    idle, beside, wave = asyncio.run(_wave_scenario(promises_url))
    print(
        f"\nidle TTFT {[round(s, 3) for s in idle]} s; just after {NUM_WAVE} batch starts: "
        f"{[None if s is None else round(s, 3) for s in beside]} s; the wave's first tokens "
        f"{sorted(round(s, 2) for s in wave if s is not None)} s"
    )
    assert len(idle) == 3 and all(s is not None for s in wave), wave  # all of it served
    assert all(s is not None for s in beside), beside
    assert max(beside) <= WAVE_FRACTION * max(wave), (beside, max(wave))
