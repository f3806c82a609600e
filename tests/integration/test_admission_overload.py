"""Admission control on the real stack, under load: a flood shed at admission, the queue's
metrics, interactive ahead of batch under saturation, deadlines. Keys and rate limits:
test_admission.py."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import pytest

from bench.client import send
from tests.integration.apps import (
    CALL_TIMEOUT_S,
    CAPACITY,
    CLIENT_TIMEOUT_S,
    DEFAULT,
    MAX_QUEUE_LEN,
    METRICS_PORT,
)
from tests.integration.conftest import engine_stats, serve_log_dir
from tests.integration.helpers import auth
from tests.integration.test_admission import chat

FLOOD_ID = f"flood-{time.time_ns()}"


def router_access_log(prefix: str, timeout_s: float = 90.0, want: int = 1) -> list[dict]:
    """The Router's access-log records whose request id starts with `prefix`."""
    deadline = time.monotonic() + timeout_s
    records: list[dict] = []
    while time.monotonic() < deadline:
        records = [
            json.loads(line[line.index("{") :])
            for f in serve_log_dir().glob("replica_llmserve_Router_*.log")
            for line in f.read_text(errors="replace").splitlines()
            if f'"request_id": "{prefix}' in line
        ]
        if len(records) >= want:
            break
        time.sleep(0.5)
    return records


async def _flood_one(client, tenant: str | None, i: int, delay_s: float):
    await asyncio.sleep(delay_s)
    headers = {**(auth(tenant) if tenant else {}), "x-request-id": f"{FLOOD_ID}-{i}"}
    body = {"model": DEFAULT, "prompt": f"Item {i}:", "max_tokens": 8, "ignore_eos": True}
    return tenant, await send(client, "/v1/completions", body, headers=headers, record_errors=False)


def test_flood_is_shed_at_admission_and_admitted_work_completes(base_url, http):
    served_before = engine_stats(DEFAULT).extra["num_requests_total"]
    tenants = ["interactive", "batch", None, "overload-limited"]
    # 10x what the replica runs at once, all arriving within one second (an open-loop burst at
    # ~10x the rate it can serve). Sent all in the same instant instead, the burst measures
    # how fast two cores parse 160 HTTP requests, in the client as much as in the server.
    num_requests = 10 * CAPACITY
    spread_s = 1.0

    async def flood():
        limits = httpx.Limits(max_connections=num_requests)
        async with httpx.AsyncClient(
            base_url=base_url, timeout=CLIENT_TIMEOUT_S, limits=limits
        ) as c:
            return await asyncio.gather(
                *(
                    _flood_one(c, tenants[i % len(tenants)], i, spread_s * i / num_requests)
                    for i in range(num_requests)
                )
            )

    results = asyncio.run(flood())
    by_status: dict[int, list[float]] = {}
    for _tenant, r in results:
        by_status.setdefault(r.status, []).append(r.latency_s)
        if r.status == 200:
            assert r.completion_tokens == 8
        else:
            assert r.status in (429, 503), (r.status, r.body)
            assert int(r.retry_after) >= 1
            error = json.loads(r.body)["error"]
            assert error["code"] in ("rate_limit_exceeded", "queue_full", "queue_wait")
    rejected = by_status.get(429, []) + by_status.get(503, [])
    rej_med, served_med = statistics.median(rejected), statistics.median(by_status.get(200, [0]))
    print(
        f"\n{num_requests} requests: {len(by_status.get(200, []))} served, "
        f"{len(by_status.get(429, []))} x 429, {len(by_status.get(503, []))} x 503; "
        f"rejections answered in median {rej_med * 1000:.0f} ms, "
        f"max {max(rejected) * 1000:.0f} ms; served in median "
        f"{served_med * 1000:.0f} ms"
    )
    assert len(by_status.get(200, [])) >= CAPACITY
    assert len(by_status.get(503, [])) > 0, "the queue never filled: the flood was too small"
    # The refusal itself is decided at once; what the client waits for is the HTTP path on two
    # cores that also run the engine for the admitted requests. The median ranged 0.05-1.1 s
    # from run to run here and the host's speed drifts 2-3x, so it is held against the requests
    # served in the same flood, which share that path and those cores: a refusal that waited
    # for a slot would take about as long as they do.
    assert rej_med < 0.5 * served_med
    assert rej_med < 60, "refusals hung"
    # Where the time goes: the Router's own view (access log e2e: from its handler's start,
    # through the body read from the proxy, to the refusal or the last token), held to the same
    # comparison: on a loaded 2-core host the Router's event loop waits for CPU too. The
    # steady-overload figure (p50 0.03 s) is bench/admission_load.py's.
    # HAProxy's shield refused some of `overload-limited`'s before any Router (docs/admission.md).
    at_router = [r for _, r in results if r.refused_by != "shield"]
    log = router_access_log(FLOOD_ID, want=len(at_router))
    inside = [r["e2e_ms"] for r in log if r["status"] in ("429", "503")]
    inside_served = [r["e2e_ms"] for r in log if r["status"] == "ok"]
    in_rej_med, in_served_med = statistics.median(inside), statistics.median(inside_served or [0])
    print(
        f"inside the Router: {len(inside)} refusals in median {in_rej_med:.1f} ms, "
        f"max {max(inside):.1f} ms; {len(inside_served)} served in median "
        f"{in_served_med:.1f} ms"
    )
    # HAProxy stamped each request (shield.EDGE_HEADER): what it waited before the Router,
    # which its promise counts; on the flood's refusals, most of what their clients waited.
    edge = sorted(r["edge_wait_ms"] for r in log if r["edge_wait_ms"] is not None)
    print(f"HAProxy to Router: median {statistics.median(edge):.1f} ms, max {edge[-1]:.1f} ms")
    assert len(edge) == len(log) and edge[-1] < 60_000
    assert len(inside) == sum(1 for r in at_router if r.status in (429, 503))
    assert len(inside_served) == len(by_status[200])
    assert in_rej_med < 0.5 * in_served_med
    # Afterwards: nothing running, nothing queued, and the replica did not restart.
    assert engine_stats(DEFAULT).num_unfinished == 0
    health = http.get("/healthz", headers=auth("interactive")).json()["models"][DEFAULT]
    assert health["in_flight"] == 0 and health["queued"] == 0
    served = engine_stats(DEFAULT).extra["num_requests_total"] - served_before
    assert served == len(by_status[200]), "the replica restarted or lost count"


def test_queue_depth_and_rejections_reach_prometheus_export(serve_app):
    """After the flood: Ray's metrics export carries the Router's queue and rejection series."""
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    wanted = (
        "ray_llmserve_queue_depth{",
        "ray_llmserve_rejections_total{",
        "ray_llmserve_edge_wait_seconds_bucket{",
    )
    deadline = time.monotonic() + 120
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(url, timeout=30).text
        if all(w in text for w in wanted) and 'reason="queue_full"' in text:
            break
        time.sleep(1)
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    print("\n" + "\n".join(lines[:6]))
    depth = [line for line in lines if line.startswith(wanted[0]) and f'model="{DEFAULT}"' in line]
    assert depth, "no queue depth series for the default model"
    full = [
        line for line in lines if 'reason="queue_full"' in line and f'model="{DEFAULT}"' in line
    ]
    assert full and float(full[0].rsplit(" ", 1)[1]) > 0


async def _ttft(client, tenant: str, i: int, max_tokens: int) -> float:
    body = {
        "model": DEFAULT,
        "prompt": f"Task {i}:",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    r = await send(client, "/v1/completions", body, headers=auth(tenant), record_errors=False)
    assert r.status == 200, r.body
    return r.first_chunk_s


def test_interactive_first_token_beats_batch_under_saturation(base_url):
    async def scenario():
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as c:
            # Saturate: the engine's slots, the Router's in-flight cap and the queue but for
            # room for the 8 probes. An interactive probe still waits for a slot to free (about
            # one batch request's time), a batch probe for the whole queue ahead of it: the
            # longer that queue, the clearer the difference (with half the queue it was 2.1x).
            background = [
                asyncio.create_task(_ttft(c, "batch", i, 48))
                for i in range(CAPACITY + MAX_QUEUE_LEN - 8)
            ]
            # How long that takes depends on the host: wait until the Router holds its cap and
            # queues the rest. (Asked of the Router's /healthz: a call to the full replica itself
            # would wait for a free slot, and the probes with it.)
            deadline = time.monotonic() + 120
            while True:
                h = (await c.get("/healthz", headers=auth("interactive"))).json()["models"][DEFAULT]
                if h["in_flight"] >= CAPACITY and h["queued"] > 0:
                    break
                assert time.monotonic() < deadline, f"the batch requests never filled it: {h}"
                await asyncio.sleep(0.2)
            # Then the same work from both classes, arriving together.
            probes = [
                asyncio.create_task(_ttft(c, tenant, 1000 + i, 16))
                for i in range(4)
                for tenant in ("interactive", "batch")
            ]
            probe_ttfts = await asyncio.gather(*probes)
            await asyncio.gather(*background)
            return probe_ttfts[0::2], probe_ttfts[1::2]

    interactive, batch = asyncio.run(scenario())
    i_med, b_med = statistics.median(interactive), statistics.median(batch)
    print(
        f"\nunder saturation: interactive TTFT median {i_med:.2f} s, batch {b_med:.2f} s "
        f"({b_med / i_med:.1f}x)"
    )
    assert i_med * 2 < b_med
    assert engine_stats(DEFAULT).num_unfinished == 0


def test_deadline_stops_a_long_stream_and_frees_the_engine(http, base_url):
    # The host's pace now: how late after its deadline a stream may end scales with it.
    t0 = time.monotonic()
    r = http.post("/v1/completions", json={"model": DEFAULT, "prompt": "Count:", "max_tokens": 1})
    t1 = time.monotonic() - t0
    assert r.status_code == 200, r.text
    t0 = time.monotonic()
    lines = []
    with httpx.Client(base_url=base_url, timeout=CALL_TIMEOUT_S) as c:
        with c.stream(
            "POST",
            "/v1/completions",
            json={
                "model": DEFAULT,
                "prompt": "Count:",
                "max_tokens": 1500,
                "ignore_eos": True,
                "stream": True,
                "timeout": 3,
            },
        ) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
    elapsed = time.monotonic() - t0
    assert lines[-1] == "data: [DONE]"
    assert "event: error" in lines and "deadline_exceeded" in lines[-2]
    assert sum(line.startswith('data: {"id"') for line in lines) >= 1  # it did stream first
    # 1500 tokens take far longer than this bound, which is what the claim rests on.
    bound_s = 3 + max(3.0, 5 * t1)
    print(
        f"\nstream with a 3 s deadline ended after {elapsed:.2f} s (bound {bound_s:.1f} s; "
        f"a 1-token request took {t1:.2f} s)"
    )
    assert 2.5 < elapsed < bound_s
    deadline = time.monotonic() + 60
    while engine_stats(DEFAULT).num_unfinished and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_stats(DEFAULT).num_unfinished == 0
    # Not streamed: a 504, then the next request is served normally.
    r = http.post(
        "/v1/completions",
        json={
            "model": DEFAULT,
            "prompt": "Count:",
            "max_tokens": 1500,
            "ignore_eos": True,
            "timeout": 2,
        },
    )
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    r = http.post("/v1/chat/completions", json=chat(temperature=0, max_tokens=20))
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("bad", ["soon", -1, 0, True])
def test_bad_timeout_is_a_400(http, bad):
    r = http.post("/v1/chat/completions", json=chat(timeout=bad))
    assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"
