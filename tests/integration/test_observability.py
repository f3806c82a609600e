"""The dashboard against a real Prometheus scraping the real app, and `llmserve status` on it.

A Prometheus server (Debian's package) started here scrapes Ray's metrics export of the session's
app every five seconds. After a little real traffic (chat, streaming, a completion, a 404, 429s
from the rate-limited tenant), every PromQL query of observability/grafana_dashboard.json must
return data through Prometheus' HTTP API, except the GPU panels, which must return nothing on a
machine without a GPU (absent, not zero).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from llmserve.ops import cli
from tests.integration.apps import (
    CAPACITY,
    CLIENT_TIMEOUT_S,
    DEFAULT,
    INT8,
    KEYS,
    METRICS_PORT,
    SIM_PREFIX,
    TINY,
    TINY_LORA,
)
from tests.integration.helpers import SIM, SIM_KEY, send_at_once
from tests.unit.test_dashboard import dashboard, expressions, is_gpu_expr, substitute

PROM_PORT = int(os.environ.get("LLMSERVE_TEST_PROMETHEUS_PORT", "19090"))
INSTALL = (
    "Debian's Prometheus server is missing: "
    "`apt-get update && apt-get install -y --no-install-recommends prometheus`"
)
POLL_S = 300
SCRAPE_S = 5

# A prompt long enough to fill whole KV blocks, sent twice: the second one can hit the prefix cache.
LONG_PROMPT = " ".join(
    f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(60)
)


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


@pytest.fixture(scope="module")
def prometheus(serve_app, tmp_path_factory):
    """A real Prometheus scraping 127.0.0.1:METRICS_PORT every SCRAPE_S; yields its base URL."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(binary, os.X_OK):
        pytest.fail(INSTALL)
    home = tmp_path_factory.mktemp("prometheus")
    config = home / "prometheus.yml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                # 5 s, not 1 or 2: a scrape that times out (a loaded host) marks every series
                # stale at once, and the instant queries below then see nothing.
                "global": {
                    "scrape_interval": f"{SCRAPE_S}s",
                    "evaluation_interval": f"{SCRAPE_S}s",
                },
                "scrape_configs": [
                    {
                        "job_name": "ray",
                        "scrape_interval": f"{SCRAPE_S}s",
                        "scrape_timeout": f"{SCRAPE_S}s",
                        "static_configs": [{"targets": [f"127.0.0.1:{METRICS_PORT}"]}],
                    }
                ],
            }
        )
    )
    log = open(home / "prometheus.log", "w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{PROM_PORT}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{PROM_PORT}"
    targets = None
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"prometheus exited {proc.returncode}: "
                    f"{(home / 'prometheus.log').read_text()[-2000:]}"
                )
            try:
                targets = httpx.get(f"{url}/api/v1/targets", timeout=10).json()["data"]
                if any(t["health"] == "up" for t in targets["activeTargets"]):
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus never scraped 127.0.0.1:{METRICS_PORT}: {targets!r}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=60)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def finite(result: list[dict]) -> list[float]:
    return [v for v in (float(s["value"][1]) for s in result) if math.isfinite(v)]


def send_traffic(http: httpx.Client) -> dict[str, int]:
    """One round of every kind of request the dashboard shows; returns status counts."""
    statuses: dict[str, int] = {}

    def note(status: int) -> None:
        statuses[str(status)] = statuses.get(str(status), 0) + 1

    key = {"Authorization": f"Bearer {KEYS['interactive']}"}
    r = http.post(
        "/v1/chat/completions",
        headers=key,
        json={
            "model": DEFAULT,
            "max_tokens": 16,
            "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        },
    )
    note(r.status_code)
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": DEFAULT,
            "max_tokens": 24,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write a haiku about GPUs."}],
        },
    ) as s:
        note(s.status_code)
        chunks = [line for line in s.iter_lines() if line.startswith("data:")]
        assert chunks[-1] == "data: [DONE]"
    for _ in range(2):  # the same long prompt twice: prefix-cache queries (and hits)
        r = http.post(
            "/v1/completions", json={"model": DEFAULT, "prompt": LONG_PROMPT, "max_tokens": 4}
        )
        note(r.status_code)
    r = http.post("/v1/completions", json={"model": TINY, "prompt": "Hello", "max_tokens": 8})
    note(r.status_code)
    r = http.post(
        "/v1/chat/completions",
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    note(r.status_code)
    # 0.5 requests/s with a burst of 2: of 4 at once, some are 429s.
    limited = {"Authorization": f"Bearer {KEYS['metrics-limited']}"}
    responses, _ = send_at_once(
        http.base_url,
        4,
        "/v1/completions",
        limited,
        {"model": TINY, "prompt": "Hi", "max_tokens": 2},
    )
    for r in responses:
        note(r.status_code)
    return statuses


def test_every_dashboard_query_returns_data_from_a_real_prometheus(serve_app, prometheus, tmp_path):
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=serve_app, timeout=CLIENT_TIMEOUT_S) as http:
        for round_ in range(3):  # spread out, so rate() over [1m] sees counters increase
            for k, v in send_traffic(http).items():
                statuses[k] = statuses.get(k, 0) + v
            if round_ < 2:
                time.sleep(SCRAPE_S)
        print(f"\nresponses by status: {statuses}")
        assert statuses.get("200", 0) >= 15 and statuses.get("404") == 3 and statuses.get("429")

        panels = [(title, substitute(expr)) for title, expr in expressions(dashboard())]
        data_panels = [(t, e) for t, e in panels if not is_gpu_expr(e)]
        gpu_panels = [(t, e) for t, e in panels if is_gpu_expr(e)]
        assert len(gpu_panels) == 2 and len(data_panels) >= 20

        t0 = time.monotonic()
        missing: list[str] = []
        while True:
            missing = [f"{t}: {e}" for t, e in data_panels if not finite(query(prometheus, e))]
            if not missing or time.monotonic() - t0 > POLL_S:
                break
            # histogram_quantile(rate(...[1m])) turns NaN a minute after the last request: on a
            # slow host, polling must not outlast the traffic it waits to see.
            send_traffic(http)
            time.sleep(SCRAPE_S)
    assert not missing, "queries without data after %.0f s:\n%s" % (
        time.monotonic() - t0,
        "\n".join(missing),
    )
    print(
        f"all {len(data_panels)} dashboard queries have data after "
        f"{time.monotonic() - t0:.1f} s of polling"
    )
    for title, expr in panels:
        result = query(prometheus, expr)
        values = ", ".join(f"{s['metric']}={float(s['value'][1]):.3g}" for s in result[:4])
        print(f"  {title:45.45s} {len(result)} series  {values[:150]}")

    if not has_gpu():  # absent, not zero
        for title, expr in gpu_panels:
            assert query(prometheus, expr) == [], f"{title}: GPU series on a machine without GPU"

    # The `model` variable's values: the configured models.
    r = httpx.get(
        f"{prometheus}/api/v1/label/model/values",
        params={"match[]": "ray_llmserve_admission_capacity"},
        timeout=10,
    )
    assert {DEFAULT, TINY} <= set(r.json()["data"])

    # Sensible values: outcomes and reasons labelled as documented, one healthy replica each,
    # time to first token never above end-to-end time.
    outcomes = {s["metric"]["outcome"] for s in query(prometheus, "ray_llmserve_requests_total")}
    assert {"ok", "404", "429"} <= outcomes, outcomes
    reasons = {s["metric"]["reason"] for s in query(prometheus, "ray_llmserve_rejections_total")}
    assert "rate_limit" in reasons, reasons
    replicas = query(
        prometheus,
        "sum by (deployment) (ray_serve_deployment_replica_healthy"
        '{deployment=~"llm-.*", application="llmserve"})',
    )
    assert {s["metric"]["deployment"]: float(s["value"][1]) for s in replicas} == {
        f"llm-{name}": 1.0 for name in (DEFAULT, TINY, INT8)
    }
    ttft_sum = finite(query(prometheus, "sum(ray_llmserve_ttft_seconds_sum)"))
    e2e_sum = finite(query(prometheus, "sum(ray_llmserve_e2e_seconds_sum)"))
    assert 0 < ttft_sum[0] <= e2e_sum[0]
    kv = finite(query(prometheus, f'ray_vllm_kv_cache_usage_perc{{model_name="{DEFAULT}"}}'))
    assert kv and all(0 <= v <= 1 for v in kv)
    # Routing decisions by reason (one replica per model here: "only"), and each replica's
    # prefix-cache lookups, from its engine's scheduler stats (docs/routing.md).
    lookups = f'sum(ray_llmserve_prefix_cache_queries_total{{model="{DEFAULT}"}})'
    decided: set[str] = set()
    looked_up: list[float] = []
    deadline = time.monotonic() + 60
    while (not decided or not looked_up) and time.monotonic() < deadline:
        decided = {
            s["metric"]["reason"] for s in query(prometheus, "ray_llmserve_routing_decisions_total")
        }
        looked_up = [v for v in finite(query(prometheus, lookups)) if v > 0]
        time.sleep(SCRAPE_S)
    reasons = {"prefix", "adapter", "load", "p2c", "affinity", "only"}  # as documented
    assert decided and decided <= reasons, decided
    assert looked_up, "no prefix-cache lookups counted for the default model's replica"
    render_the_dashboard(prometheus, tmp_path)


def test_an_adapter_s_requests_and_its_load_reach_a_real_prometheus(prometheus, http):
    """Metrics by adapter: its requests count under its own name, and the replica that served it
    says it holds it and loaded it (its watchdog's look at the engine, once a second)."""
    r = http.post("/v1/completions", json={"model": TINY_LORA, "prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 200, r.text
    adapter = f'adapter="{TINY_LORA}"'
    exprs = {
        "requests": f'sum(ray_llmserve_requests_total{{model="{TINY_LORA}"}})',
        "held": f"max(ray_llmserve_adapter_held{{{adapter}}})",
        "loads": f"sum(ray_llmserve_adapter_loads_total{{{adapter}}})",
    }
    seen: dict[str, list[float]] = {}
    deadline = time.monotonic() + POLL_S
    while time.monotonic() < deadline:
        seen = {k: finite(query(prometheus, e)) for k, e in exprs.items()}
        if all(v and v[0] >= 1 for v in seen.values()):
            break
        time.sleep(SCRAPE_S)
    assert all(v and v[0] >= 1 for v in seen.values()), seen
    assert seen["held"] == [1.0], seen


def render_the_dashboard(prometheus: str, tmp_path: Path) -> None:
    """The README's picture of the dashboard comes from here: every non-GPU panel has a line.
    Set LLMSERVE_DASHBOARD_PNG to keep the image."""
    from observability import render_dashboard as rd

    end = time.time()
    collected = rd.collect(
        rd.json.loads(rd.DASHBOARD.read_text()), rd.fetch_range(prometheus, end - 300, end, 2.0)
    )
    empty = [name for name, _, series in collected if not series and "GPU" not in name]
    assert not empty, f"panels without data: {empty}"
    out = Path(os.environ.get("LLMSERVE_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    rd.render(collected, out, "llmserve dashboard (integration test run)")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    print(f"\n{out}: {len(collected)} panels, {out.stat().st_size} bytes")


def test_status_once_shows_each_model(serve_app, capsys):
    with httpx.Client(base_url=serve_app, timeout=CLIENT_TIMEOUT_S) as http:
        r = http.post("/v1/completions", json={"model": DEFAULT, "prompt": "Hi", "max_tokens": 8})
        assert r.status_code == 200
        # The sim app runs the shipped admission: its standard class promises a first token.
        body = {"model": SIM, "prompt": "x", "max_tokens": 4, "stream": True}
        r = http.post(f"{SIM_PREFIX}/v1/completions", json=body, headers=SIM_KEY)
        assert r.status_code == 200
    argv = [
        "status",
        "--url",
        serve_app,
        "--interval",
        "1",
        "--once",
        "--timeout-s",
        "60",
        "--metrics-url",
        f"http://127.0.0.1:{METRICS_PORT}/metrics",
    ]
    # Ray exports every second, as far as a loaded host lets it: until the model's TTFT shows.
    deadline = time.monotonic() + 120
    while True:
        rc = cli.main(argv)
        out = capsys.readouterr().out
        rows = {line.split()[0]: line.split() for line in out.splitlines()[3:] if line.strip()}
        shown = rc == 0 and len(rows.get(DEFAULT, [])) > 4 and rows[DEFAULT][4] != "-"
        shown = shown and any(c.rstrip("*").endswith("%") for c in rows.get(SIM, []))
        if shown or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(out)
    assert rc == 0
    assert f"router {serve_app}: ok" in out
    default = rows[DEFAULT]
    assert default[1] == "1", default  # one healthy replica
    assert default[3].endswith(f"/{CAPACITY}"), default  # in-flight/cap
    assert default[4] != "-" and default[6] != "-", default  # TTFT p50, TTFT p99 (value + unit)
    # (No check of the default model's promise column: metrics are by model, and the promises
    # module's app served a model of that name with a promise on this cluster before. Without
    # one the column is "-": tests/unit/test_status.py.)
    # The share of promised first tokens in time: the sim's one request met its 2 s.
    assert [c.rstrip("*") for c in rows[SIM] if c.rstrip("*").endswith("%")] == ["100%"], rows
    assert TINY in rows
