"""One trace per request across the Router and the replica, and one access-log line."""

from __future__ import annotations

import json
import time

import httpx

from tests.integration.apps import DEFAULT, KEYS, SIM_PREFIX, TRACE_FILE
from tests.integration.conftest import serve_log_dir


def _spans(trace_id: str) -> list[dict]:
    if not TRACE_FILE.exists():
        return []
    spans = [json.loads(line) for line in TRACE_FILE.read_text().splitlines() if line.strip()]
    return [s for s in spans if s["trace_id"] == trace_id]


def test_one_trace_spans_router_and_replica(http):
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    r = http.post(
        "/v1/chat/completions",
        headers={
            "traceparent": f"00-{trace_id}-b7ad6b7169203331-01",
            "Authorization": f"Bearer {KEYS['interactive']}",
        },
        json={"model": DEFAULT, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200
    assert r.headers["traceparent"].split("-")[1] == trace_id
    wanted = {
        "POST /v1/chat/completions",
        "authenticate",
        "admit",
        "rate_limit",
        "queue_wait",
        "dispatch",
        "llmserver.generate",
        "stream",
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not wanted <= {s["name"] for s in _spans(trace_id)}:
        time.sleep(0.3)
    spans = {s["name"]: s for s in _spans(trace_id)}
    print("\n" + "\n".join(f"{n}: parent {s['parent_id']}" for n, s in spans.items()))
    assert wanted <= set(spans)
    root = spans["POST /v1/chat/completions"]
    assert root["parent_id"] == "b7ad6b7169203331"  # continues the client's trace
    for name in ("authenticate", "admit", "dispatch", "stream"):
        assert spans[name]["parent_id"] == root["span_id"]
    for name in ("rate_limit", "queue_wait"):
        assert spans[name]["parent_id"] == spans["admit"]["span_id"]
    # The replica's span, in another process, hangs under the Router's dispatch span.
    assert spans["llmserver.generate"]["parent_id"] == spans["dispatch"]["span_id"]
    assert spans["dispatch"]["attributes"]["llmserve.replica"]


def test_spans_reach_an_otlp_collector_with_router_to_replica_links(base_url, otlp):
    """The sim app exports over OTLP/HTTP; the test's in-memory receiver is the collector."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = httpx.post(
        f"{base_url}{SIM_PREFIX}/v1/chat/completions",
        timeout=120,
        headers={
            "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
            "Authorization": f"Bearer {KEYS['metered']}",
        },
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
            "stream": True,
        },
    )
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert r.headers["traceparent"].split("-")[1] == trace_id
    wanted = {
        f"POST {SIM_PREFIX}/v1/chat/completions",
        "authenticate",
        "admit",
        "rate_limit",
        "queue_wait",
        "dispatch",
        "llmserver.generate",
        "stream",
    }
    deadline = time.monotonic() + 120  # the batch exporter sends every 5 s
    while time.monotonic() < deadline and not wanted <= {s["name"] for s in otlp.trace(trace_id)}:
        time.sleep(0.5)
    spans = {s["name"]: s for s in otlp.trace(trace_id)}
    print(
        "\n"
        + "\n".join(
            f"{n}: pid {s['process_pid']} parent {s['parent_id']}" for n, s in spans.items()
        )
    )
    assert wanted <= set(spans), f"missing {wanted - set(spans)}"
    root = spans[f"POST {SIM_PREFIX}/v1/chat/completions"]
    assert root["parent_id"] == "00f067aa0ba902b7"
    for name in ("authenticate", "admit", "dispatch", "stream"):
        assert spans[name]["parent_id"] == root["span_id"]
    for name in ("rate_limit", "queue_wait"):
        assert spans[name]["parent_id"] == spans["admit"]["span_id"]
    replica = spans["llmserver.generate"]
    assert replica["parent_id"] == spans["dispatch"]["span_id"]
    assert replica["process_pid"] != root["process_pid"]  # really another process
    assert "first_token" in replica["events"]
    assert (
        replica["attributes"]["llmserve.replica"]
        == spans["dispatch"]["attributes"]["llmserve.replica"]
    )
    assert spans["stream"]["attributes"]["llmserve.completion_tokens"] == 8
    assert spans["rate_limit"]["attributes"]["llmserve.tenant"] == "metered"


def test_access_log_line_per_request(http):
    r = http.post(
        "/v1/completions",
        headers={"x-request-id": "access-log-test-1"},
        json={"model": DEFAULT, "prompt": "Hello", "max_tokens": 3},
    )
    assert r.status_code == 200
    deadline = time.monotonic() + 60
    line = None
    while time.monotonic() < deadline and line is None:
        for f in serve_log_dir().glob("replica_llmserve_Router_*.log"):
            for text in f.read_text(errors="replace").splitlines():
                if '"request_id": "access-log-test-1"' in text:
                    line = text
        time.sleep(0.3)
    assert line is not None, "no access-log line for the request"
    record = json.loads(line[line.index("{") :])
    print(f"\n{record}")
    assert record["status"] == "ok" and record["model"] == DEFAULT
    assert record["tenant"] == "anonymous" and record["completion_tokens"] == 3
    assert record["prompt_tokens"] > 0 and record["ttft_ms"] > 0 and record["replica"]
    assert len(record["trace_id"]) == 32
    assert KEYS["interactive"] not in line


def test_api_keys_never_reach_logs_or_traces(http):
    # Use every key at least once, then look everywhere the platform writes.
    for key in KEYS.values():
        http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
        )
    time.sleep(2)
    logs = serve_log_dir()
    places = [
        TRACE_FILE,
        *logs.parent.glob("*.log"),
        *logs.parent.glob("*.err"),
        *logs.parent.glob("*.out"),
        *logs.glob("*.log"),
    ]
    leaks = [
        (p.name, name)
        for p in places
        if p.is_file()
        for name, key in KEYS.items()
        if key in p.read_text(errors="replace")
    ]
    print(f"\nsearched {len(places)} log and trace files")
    assert not leaks, f"API keys found in {leaks}"


def _scrape_sum(metric: str, **labels: str) -> float:
    import httpx as _httpx

    from tests.integration.apps import METRICS_PORT

    text = _httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=60).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(metric + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_token_counters_equal_the_usage_the_api_returned(http):
    tenant = {"tenant": "tiny-only"}
    before = (
        _scrape_sum("ray_llmserve_prompt_tokens_total", **tenant),
        _scrape_sum("ray_llmserve_generation_tokens_total", **tenant),
    )
    prompt = completion = 0
    for i in range(3):
        r = http.post(
            "/v1/completions",
            headers={"Authorization": f"Bearer {KEYS['tiny-only']}"},
            json={
                "model": "tiny-llama-random",
                "prompt": f"Count {i}",
                "max_tokens": 5 + i,
                "ignore_eos": True,
            },
        )
        assert r.status_code == 200
        prompt += r.json()["usage"]["prompt_tokens"]
        completion += r.json()["usage"]["completion_tokens"]
    deadline = time.monotonic() + 120
    got = (0.0, 0.0)
    while time.monotonic() < deadline:
        got = (
            _scrape_sum("ray_llmserve_prompt_tokens_total", **tenant) - before[0],
            _scrape_sum("ray_llmserve_generation_tokens_total", **tenant) - before[1],
        )
        if got == (prompt, completion):
            break
        time.sleep(1)
    print(f"\nAPI usage: {prompt} prompt, {completion} completion tokens; counters moved by {got}")
    assert got == (prompt, completion)
