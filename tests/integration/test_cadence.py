"""Tokens reach the client when the engine makes them: one stream, through HAProxy, the Router
and the replica, each token arrives on its own at the engine's pace, not in lumps of a flush
window. The apps keep the config's default `stream_flush_ms` (0). A window of 50 ms fails the
simulated engine's test (tokens 5.5 ms apart come in lumps); 200 ms fails both (the real engine
here makes a token every ~50 ms)."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np

from tests.integration.apps import CLIENT_TIMEOUT_S, DEFAULT, SIM_PREFIX
from tests.integration.helpers import SIM, SIM_KEY, auth


def arrivals(url: str, headers: dict[str, str], body: dict) -> list[float]:
    """When each SSE event with text was read by the client (seconds, monotonic)."""
    times = []
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as c:
        with c.stream("POST", url, json=body | {"stream": True}, headers=headers) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:])["choices"]
                if choices and (
                    choices[0].get("text") or choices[0].get("delta", {}).get("content")
                ):
                    times.append(time.monotonic())
    return times


def test_one_stream_gets_each_simulated_token_at_the_engines_pace(base_url):
    # The simulated engine makes one token per 5.5 ms step (step_s + one sequence's share).
    body = {"model": SIM, "prompt": "x", "max_tokens": 120}
    times = arrivals(f"{base_url}{SIM_PREFIX}/v1/completions", SIM_KEY, body)
    assert len(times) == 120
    gaps_ms = np.diff(times) * 1000
    mean, p50, p90 = gaps_ms.mean(), np.percentile(gaps_ms, 50), np.percentile(gaps_ms, 90)
    together = int((gaps_ms < 0.5).sum())
    print(
        f"\n120 simulated tokens: gaps p50 {p50:.1f} ms, p90 {p90:.1f} ms, mean {mean:.1f} ms; "
        f"{together} arrived with the one before"
    )
    # A window of w ms makes the gaps ~0 inside a lump and ~w between: p50 ~0, p90 ~w.
    assert p50 >= 0.5 * mean
    assert p90 <= 3 * mean
    assert together <= 12  # a tenth may ride together while the host is busy


def test_one_stream_gets_each_real_token_on_its_own(base_url):
    body = {
        "model": DEFAULT,
        "messages": [{"role": "user", "content": "Count from 1 to 50."}],
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0,
    }
    times = arrivals(f"{base_url}/v1/chat/completions", auth("interactive"), body)
    gaps_ms = np.diff(times) * 1000
    together = int((gaps_ms < 0.5).sum())
    print(
        f"\n{len(times)} pieces of text from the real engine: gaps p50 "
        f"{np.percentile(gaps_ms, 50):.1f} ms, p90 {np.percentile(gaps_ms, 90):.1f} ms; "
        f"{together} arrived with the one before"
    )
    assert len(times) >= 38  # vLLM writes one event per token (a few may carry no text)
    assert together <= 4
