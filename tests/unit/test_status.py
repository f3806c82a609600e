"""llmserve/ops/status.py: parsing Ray's exposition text, quantiles from buckets, rates, the
table."""

from __future__ import annotations

import io
import math

import pytest

from llmserve.ops import cli, status
from llmserve.ops.status import (
    ModelMetrics,
    Snapshot,
    bucket_delta,
    counter_rate,
    histogram_quantile,
    model_rows,
    parse_models,
    render,
)

M = "smollm2-135m-instruct"
R = 'application="llmserve",deployment="Router",replica="r1"'


def exposition(
    ttft: list[int],
    tokens: float,
    queue: float = 2,
    in_flight: float = 5,
    replicas: int = 2,
    promise: tuple[float, float] | None = (9, 1),
) -> str:
    """Ray-like text: two Router label sets (tenants), two Serve replicas, one 'unknown' model."""
    bounds = ["0.1", "0.25", "0.5", "1.0", "+Inf"]
    lines = [
        "# HELP ray_llmserve_ttft_seconds Time to first token at the Router.",
        "# TYPE ray_llmserve_ttft_seconds histogram",
    ]
    for tenant, share in (("a", 1), ("b", 0)):
        cum = 0
        for le, n in zip(bounds, ttft):
            cum += n * share
            lines.append(
                f'ray_llmserve_ttft_seconds_bucket{{{R},le="{le}",model="{M}",'
                f'priority="standard",tenant="{tenant}"}} {cum}'
            )
        lines.append(
            f'ray_llmserve_ttft_seconds_count{{{R},model="{M}",priority="standard",'
            f'tenant="{tenant}"}} {cum}'
        )
        lines.append(
            f'ray_llmserve_ttft_seconds_sum{{{R},model="{M}",priority="standard",'
            f'tenant="{tenant}"}} 1.5'
        )
    lines += [
        "# HELP ray_llmserve_generation_tokens_total Generated tokens.",
        "# TYPE ray_llmserve_generation_tokens_total counter",
        f'ray_llmserve_generation_tokens_total{{{R},model="{M}",priority="standard",tenant="a"}} '
        f"{tokens - 10}",
        f'ray_llmserve_generation_tokens_total{{{R},model="{M}",priority="batch",tenant="b"}} 10',
        "# TYPE ray_llmserve_ttft_objective_total counter",
        *(
            f'ray_llmserve_ttft_objective_total{{{R},model="{M}",priority="{p}",'
            f'result="{result}",tenant="a"}} {n / 2}'
            for p in ("interactive", "standard")
            for result, n in zip(("met", "missed"), promise or ())
        ),
        "# HELP ray_llmserve_queue_depth Requests waiting.",
        "# TYPE ray_llmserve_queue_depth gauge",
        f'ray_llmserve_queue_depth{{{R},model="{M}"}} {queue}',
        f'ray_llmserve_queue_depth{{{R},model="unknown"}} 7',
        "# TYPE ray_llmserve_in_flight gauge",
        f'ray_llmserve_in_flight{{{R},model="{M}"}} {in_flight}',
        "# TYPE ray_llmserve_admission_capacity gauge",
        f'ray_llmserve_admission_capacity{{{R},model="{M}"}} 16',
        "# HELP ray_serve_deployment_replica_healthy Tracks healthy replicas.",
        "# TYPE ray_serve_deployment_replica_healthy gauge",
    ]
    for i in range(replicas):
        lines.append(
            'ray_serve_deployment_replica_healthy{application="llmserve",'
            f'deployment="llm-{M}",replica="x{i}"}} 1'
        )
    lines += [
        'ray_serve_deployment_replica_healthy{application="llmserve",deployment="llm-tiny",'
        'replica="t0"} 1',
        'ray_serve_deployment_replica_healthy{application="llmserve",deployment="llm-tiny",'
        'replica="t1"} 0',
        'ray_serve_deployment_replica_healthy{application="llmserve",deployment="Router",'
        'replica="r1"} 1',
        "# TYPE ray_vllm_num_requests_running gauge",
        f'ray_vllm_num_requests_running{{model_name="{M}",engine="0",ReplicaId="x0"}} 3',
    ]
    return "\n".join(lines) + "\n"


def test_parse_models_sums_label_sets_and_maps_deployments():
    models = parse_models([exposition([1, 2, 3, 4, 0], tokens=110)])
    assert set(models) == {M, "tiny"}  # not the Router deployment, not "unknown"
    m = models[M]
    assert m.replicas == 2
    assert (m.queue_depth, m.in_flight, m.capacity) == (2, 5, 16)
    assert m.generation_tokens == 110
    assert m.ttft_buckets == {0.1: 1, 0.25: 3, 0.5: 6, 1.0: 10, math.inf: 10}
    assert m.promise == {"met": 9, "missed": 1}  # summed over classes
    tiny = models["tiny"]  # only Serve knows it: one healthy replica of two
    assert tiny.replicas == 1 and tiny.queue_depth is None and tiny.ttft_buckets == {}
    assert "unknown" not in models


def test_parse_models_sums_nodes():
    one = exposition([1, 0, 0, 0, 0], tokens=20, queue=1, in_flight=1, replicas=1)
    models = parse_models([one, one])
    m = models[M]
    assert (m.replicas, m.queue_depth, m.in_flight, m.generation_tokens) == (2, 2, 2, 40)
    assert m.ttft_buckets[math.inf] == 2


def test_parse_models_matches_sanitised_deployment_names():
    text = (
        "# TYPE ray_llmserve_in_flight gauge\n"
        'ray_llmserve_in_flight{model="org:m-v1"} 1\n'
        "# TYPE ray_serve_deployment_replica_healthy gauge\n"
        'ray_serve_deployment_replica_healthy{deployment="llm-org_m-v1"} 3\n'
    )
    assert parse_models([text]) == {"org:m-v1": ModelMetrics(replicas=3, in_flight=1)}


def test_deployment_of_matches_the_app():
    from llmserve.app import deployment_name
    from llmserve.config.app_config import ModelConfig

    for name in ["smollm2-135m-instruct", "org:m-v1", "a.b_c"]:
        assert status.deployment_of(name) == deployment_name(ModelConfig(name=name, source="x/y"))


@pytest.mark.parametrize(
    "q, buckets, expected",
    [
        # Prometheus' own interpolation: rank 5 of 10 in (0.25, 0.5] holding counts 3..6.
        (0.5, {0.1: 1, 0.25: 3, 0.5: 6, 1.0: 10, math.inf: 10}, 0.25 + 0.25 * 2 / 3),
        (0.99, {0.1: 1, 0.25: 3, 0.5: 6, 1.0: 10, math.inf: 10}, 0.5 + 0.5 * 3.9 / 4),
        # First bucket interpolates from 0.
        (0.5, {0.1: 4, 1.0: 4, math.inf: 4}, 0.05),
        # A rank in +Inf gives the largest finite bound.
        (0.99, {0.1: 1, 1.0: 1, math.inf: 10}, 1.0),
        # Empty histogram, or no +Inf bucket: no answer.
        (0.5, {0.1: 0, math.inf: 0}, None),
        (0.5, {}, None),
        (0.5, {0.1: 3}, None),
    ],
)
def test_histogram_quantile(q, buckets, expected):
    got = histogram_quantile(q, buckets)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_histogram_quantile_rejects_bad_q():
    with pytest.raises(ValueError):
        histogram_quantile(1.5, {math.inf: 1})


def test_bucket_delta_and_counter_reset():
    prev = {0.1: 1, 1.0: 3, math.inf: 3}
    assert bucket_delta(prev, {0.1: 1, 1.0: 5, math.inf: 6}) == {0.1: 0, 1.0: 2, math.inf: 3}
    assert bucket_delta(prev, {0.1: 0, 1.0: 1, math.inf: 1}) is None  # the Router restarted
    assert bucket_delta({}, {math.inf: 2}) == {math.inf: 2}


def test_counter_rate():
    assert counter_rate(100, 170, 2.0) == 35
    assert counter_rate(None, 10, 2.0) == 5  # the counter appeared in between
    assert counter_rate(100, 50, 2.0) is None  # reset
    assert counter_rate(100, None, 2.0) is None
    assert counter_rate(1, 2, 0) is None


def snap(t: float, text: str) -> Snapshot:
    return Snapshot(time_s=t, models=parse_models([text]))


def test_model_rows_use_the_last_interval_then_fall_back_to_all_time():
    a = snap(10.0, exposition([1, 2, 3, 4, 0], tokens=110))
    # Two seconds later: 4 more requests, all in (0.1, 0.25]; 70 more tokens.
    b = snap(12.0, exposition([1, 6, 3, 4, 0], tokens=180, promise=(12, 2)))
    row = {r.model: r for r in model_rows(a, b)}[M]
    assert row.promise_kept == pytest.approx(3 / 4)  # of the 4 promised in the interval
    assert not row.ttft_all_time
    assert row.ttft_p50_s == pytest.approx(0.1 + 0.15 * 2 / 4)
    assert row.ttft_p99_s == pytest.approx(0.1 + 0.15 * 3.96 / 4)
    assert row.tokens_per_s == pytest.approx(35)
    assert (row.replicas, row.queue_depth, row.in_flight, row.capacity) == (2, 2, 5, 16)
    # Nothing finished in the next interval: all-time quantiles, zero tokens/s.
    c = snap(14.0, exposition([1, 6, 3, 4, 0], tokens=180))
    row = {r.model: r for r in model_rows(b, c)}[M]
    assert row.ttft_all_time and row.tokens_per_s == 0
    assert row.promise_kept == pytest.approx(9 / 10)  # all-time, as TTFT
    assert row.ttft_p50_s == pytest.approx(histogram_quantile(0.5, c.models[M].ttft_buckets))
    # First refresh: no previous scrape, no rate yet.
    row = {r.model: r for r in model_rows(None, a)}[M]
    assert row.ttft_all_time and row.tokens_per_s is None


def test_render_table():
    a = snap(10.0, exposition([1, 2, 3, 4, 0], tokens=110))
    b = snap(12.0, exposition([1, 6, 3, 4, 0], tokens=180, promise=(12, 2)))
    text = render(model_rows(a, b), "HEADER")
    lines = text.splitlines()
    assert lines[0] == "HEADER"
    assert lines[2].split() == [
        "model",
        "replicas",
        "queue",
        "in-flight",
        "TTFT",
        "p50",
        "TTFT",
        "p99",
        "promise",
        "kept",
        "tokens/s",
    ]
    row = next(line for line in lines if line.startswith(M)).split()
    assert row == [M, "2", "2", "5/16", "175", "ms", "248", "ms", "75%", "35.0"]
    tiny = next(line for line in lines if line.startswith("tiny")).split()
    assert tiny == ["tiny", "1", "-", "-", "-", "-", "-", "-"]
    assert "*" not in text
    assert "no models" in render([], "H")
    all_time = render(model_rows(None, a), "H")
    assert "ms*" in all_time and "* all requests so far" in all_time


def test_a_model_whose_classes_promise_nothing_shows_no_promise():
    a = snap(10.0, exposition([1, 2, 3, 4, 0], tokens=110, promise=None))
    b = snap(12.0, exposition([1, 6, 3, 4, 0], tokens=180, promise=None))
    for rows in (model_rows(a, b), model_rows(None, b)):  # the interval's, and all-time
        row = {r.model: r for r in rows}[M]
        assert row.ttft_p50_s is not None and row.promise_kept is None
    row = next(line for line in render(model_rows(a, b), "H").splitlines() if line.startswith(M))
    assert row.split()[8] == "-"


def test_with_router_models_fills_models_without_metrics():
    s = status.with_router_models(
        Snapshot(1.0, {}), {"m": {"capacity": 16, "in_flight": 0, "queued": 0}}
    )
    assert s.models["m"] == ModelMetrics(queue_depth=0, in_flight=0, capacity=16)


def test_router_health():
    assert status.router_health(lambda u: {"status": "ok", "models": {"m": {}}}, "http://h/") == (
        "ok",
        {"m": {}},
    )

    def down(url):
        raise ConnectionError(url)

    assert status.router_health(down, "http://h") == ("unreachable (ConnectionError)", {})


def test_cli_status_once_against_fake_endpoints(monkeypatch):
    """`llmserve status --once` wires the pieces: two scrapes, one table, exit 0."""
    texts = iter([exposition([1, 2, 3, 4, 0], tokens=110), exposition([1, 6, 3, 4, 0], 180)])

    class FakeResponse:
        def __init__(self, url):
            self.url = url
            self.text = next(texts) if url.endswith("/metrics") else ""

        def raise_for_status(self):
            pass

        def json(self):
            return {"status": "ok", "models": {M: {"capacity": 16, "in_flight": 0, "queued": 0}}}

    class FakeClient:
        def __init__(self, timeout, headers=None):
            pass

        def get(self, url):
            return FakeResponse(url)

        def close(self):
            pass

    import httpx

    monkeypatch.setattr(httpx, "Client", FakeClient)
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    assert (
        cli.main(
            [
                "status",
                "--url",
                "http://app",
                "--metrics-url",
                "http://n1/metrics",
                "--interval",
                "0.01",
                "--once",
            ]
        )
        == 0
    )
    text = out.getvalue()
    assert "router http://app: ok" in text
    row = next(line for line in text.splitlines() if line.startswith(M)).split()
    assert row[:4] == [M, "2", "2", "5/16"]
    assert float(row[-1]) > 0  # 70 tokens over the measured interval; exact rates tested above
    assert "\x1b[" not in text  # no screen clearing when not a terminal / --once


def test_cli_status_reports_unreachable_metrics(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    rc = cli.main(
        [
            "status",
            "--url",
            "http://127.0.0.1:9",
            "--metrics-url",
            "http://127.0.0.1:9/metrics",
            "--interval",
            "0.01",
            "--once",
        ]
    )
    assert rc == 1
    assert "unreachable" in out.getvalue()
