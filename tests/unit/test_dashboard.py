"""The Grafana dashboard and the Prometheus scrape config in observability/.

Every panel queries Prometheus, every metric it names is one the app exports (checked against the
Router's and vLLM's sources), and promtool parses every expression and the scrape config. The
same expressions run against a real Prometheus in tests/integration/test_observability.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "grafana_dashboard.json"
PROMETHEUS_YML = ROOT / "observability" / "prometheus.yml"
INSTALL_PROMTOOL = (
    "promtool is missing: install Debian's Prometheus with "
    "`apt-get update && apt-get install -y --no-install-recommends prometheus` "
    "(`make test` does this where apt-get is available)"
)

# Names as scraped from Ray's export port: Ray prefixes app metrics with `ray_` and replaces
# vLLM's ':' with '_'; counters end in `_total`; histograms expose `_bucket`, `_sum`, `_count`.
ROUTER_HISTOGRAMS = [
    "ray_llmserve_ttft_seconds",
    "ray_llmserve_tpot_seconds",
    "ray_llmserve_e2e_seconds",
    "ray_llmserve_queue_wait_seconds",
]
ROUTER_COUNTERS = [
    "ray_llmserve_requests_total",
    "ray_llmserve_prompt_tokens_total",
    "ray_llmserve_generation_tokens_total",
    "ray_llmserve_rejections_total",
    "ray_llmserve_routing_decisions_total",
    "ray_llmserve_prefix_cache_queries_total",
    "ray_llmserve_prefix_cache_hits_total",
]
ROUTER_GAUGES = [
    "ray_llmserve_queue_depth",
    "ray_llmserve_in_flight",
    "ray_llmserve_admission_capacity",
]
GPU_GAUGES = ["ray_llmserve_gpu_utilization_percent", "ray_llmserve_gpu_memory_used_bytes"]
VLLM_GAUGES = [
    "ray_vllm_num_requests_running",
    "ray_vllm_num_requests_waiting",
    "ray_vllm_kv_cache_usage_perc",
]
VLLM_COUNTERS = [
    "ray_vllm_prefix_cache_queries_total",
    "ray_vllm_prefix_cache_hits_total",
    "ray_vllm_prompt_tokens_total",
    "ray_vllm_generation_tokens_total",
    "ray_vllm_num_preemptions_total",
    "ray_vllm_request_success_total",
]
VLLM_HISTOGRAMS = [
    "ray_vllm_time_to_first_token_seconds",
    "ray_vllm_inter_token_latency_seconds",
    "ray_vllm_e2e_request_latency_seconds",
    "ray_vllm_request_queue_time_seconds",
]
SERVE_GAUGES = ["ray_serve_deployment_replica_healthy"]


def _series(histograms: list[str]) -> list[str]:
    return [h + suffix for h in histograms for suffix in ("_bucket", "_sum", "_count")]


KNOWN_METRICS = frozenset(
    _series(ROUTER_HISTOGRAMS)
    + ROUTER_COUNTERS
    + ROUTER_GAUGES
    + GPU_GAUGES
    + VLLM_GAUGES
    + VLLM_COUNTERS
    + _series(VLLM_HISTOGRAMS)
    + SERVE_GAUGES
)

# PromQL words that are not metric names.
PROMQL_FUNCTIONS_AND_KEYWORDS = frozenset(
    "sum min max avg count stddev stdvar topk bottomk quantile count_values group by without on "
    "ignoring group_left group_right bool and or unless offset rate irate increase delta idelta "
    "histogram_quantile abs clamp_min clamp_max clamp label_replace vector scalar time "
    "max_over_time min_over_time avg_over_time sum_over_time absent absent_over_time inf nan "
    "deriv predict_linear round ceil floor".split()
)


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def query_panels(dash: dict) -> list[dict]:
    """Every panel but rows, including panels nested in collapsed rows."""
    out = []
    for p in dash["panels"]:
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def expressions(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in query_panels(dash) for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    """The expression as Grafana sends it with the `model` variable at "All"."""
    return expr.replace("${model}", ".*").replace("$model", ".*")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers outside label matchers, strings,
    grouping clauses and ranges that are neither functions nor keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery windows
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word in PROMQL_FUNCTIONS_AND_KEYWORDS:
            continue
        names.add(word)
    return names


def is_gpu_expr(expr: str) -> bool:
    return any(name in GPU_GAUGES for name in metric_names(expr))


def test_dashboard_parses_with_datasource_and_model_variables():
    dash = dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["multi"] and model["includeAll"]
    assert model["allValue"] == ".*"
    assert model["datasource"]["uid"] == "${DS_PROMETHEUS}"
    # Its query is Grafana's label_values() over a metric that the app exports.
    m = re.fullmatch(r"label_values\((\w+),\s*model\)", model["definition"])
    assert m and m.group(1) in KNOWN_METRICS


def test_every_panel_has_a_prometheus_query():
    dash = dashboard()
    panels = query_panels(dash)
    assert len(panels) >= 14
    ids = [p["id"] for p in dash["panels"]] + [p["id"] for p in panels if p not in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        targets = p.get("targets", [])
        assert targets and all(t.get("expr", "").strip() for t in targets), p["title"]
        assert len({t["refId"] for t in targets}) == len(targets), p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]


def test_dashboard_covers_what_an_operator_needs():
    """The panels the issue asks for, each found by the metric it plots."""
    used = {name for _, e in expressions(dashboard()) for name in metric_names(e)}
    for needed in [
        "ray_llmserve_ttft_seconds_bucket",
        "ray_llmserve_tpot_seconds_bucket",
        "ray_llmserve_generation_tokens_total",
        "ray_llmserve_requests_total",
        "ray_llmserve_queue_depth",
        "ray_llmserve_queue_wait_seconds_bucket",
        "ray_llmserve_rejections_total",
        "ray_vllm_kv_cache_usage_perc",
        "ray_vllm_num_requests_running",
        "ray_vllm_num_requests_waiting",
        "ray_serve_deployment_replica_healthy",
        *GPU_GAUGES,
    ]:
        assert needed in used, needed
    exprs = [e for _, e in expressions(dashboard())]
    for q in ("0.5", "0.95", "0.99"):
        assert any(
            e.startswith(
                f"histogram_quantile({q}, sum by (le, model) (rate(ray_llmserve_ttft_seconds_bucket"
            )
            for e in exprs
        ), q


def test_every_metric_in_the_dashboard_is_a_known_name():
    for title, expr in expressions(dashboard()):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        unknown = names - KNOWN_METRICS
        assert not unknown, f"{title}: unknown metrics {sorted(unknown)} in {expr!r}"


def test_metric_name_extraction():
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, model) (rate(ray_a_bucket{model=~"x|y"}[1m])))'
    ) == {"ray_a_bucket"}
    assert metric_names('(sum by (m) (rate(a_total[1m])) or 0 * sum(b)) / sum(c{le="0.5"})') == {
        "a_total",
        "b",
        "c",
    }
    assert metric_names("ray_x offset 5m") == {"ray_x"}


def _base(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


def test_router_names_match_the_apps_metrics():
    """Each ray_llmserve_* name is declared in llmserve/observability/metrics.py (GPU ones
    anywhere in the app's sources), so a rename there fails here rather than in a blank Grafana
    panel."""
    declared = set()
    for path in (ROOT / "llmserve").rglob("*.py"):
        declared |= set(re.findall(r"[\"'](llmserve_[a-z0-9_]+)[\"']", path.read_text()))
    router = ROUTER_HISTOGRAMS + ROUTER_COUNTERS + ROUTER_GAUGES
    metrics_py = (ROOT / "llmserve" / "observability" / "metrics.py").read_text()
    for name in router:
        assert f'"{_base(name).removeprefix("ray_")}"' in metrics_py, name
    for name in GPU_GAUGES:
        assert _base(name).removeprefix("ray_") in declared, f"{name}: not declared in llmserve/"


def test_vllm_names_match_vllms_prometheus_stat_logger():
    """ray_vllm_X is vLLM's `vllm:X` with ':' made '_' by its Ray stat logger."""
    spec = importlib.util.find_spec("vllm")
    assert spec and spec.submodule_search_locations, "vllm is not installed"
    loggers = Path(spec.submodule_search_locations[0]) / "v1" / "metrics" / "loggers.py"
    declared = set(re.findall(r'name="vllm:([a-z0-9_]+)"', loggers.read_text()))
    for name in VLLM_GAUGES + VLLM_COUNTERS + VLLM_HISTOGRAMS:
        assert _base(name).removeprefix("ray_vllm_") in declared, name


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(INSTALL_PROMTOOL)
    return path


def test_promtool_accepts_the_scrape_config():
    run = subprocess.run(
        [promtool(), "check", "config", str(PROMETHEUS_YML)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "127.0.0.1:8080" in PROMETHEUS_YML.read_text()
    assert re.search(r"scrape_interval:\s*5s", PROMETHEUS_YML.read_text())


def test_promtool_parses_every_dashboard_expression(tmp_path):
    """promtool parses each expression (as a recording rule) with the variables filled in."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:panel_{i}", "expr": substitute(expr)}
                    for i, (_, expr) in enumerate(expressions(dashboard()))
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    run = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rules['groups'][0]['rules'])} rules found" in run.stdout, run.stdout


def test_promtool_rejects_a_broken_expression(tmp_path):
    """The check above can fail: a missing parenthesis is caught."""
    path = tmp_path / "bad.yml"
    path.write_text(
        json.dumps(
            {
                "groups": [
                    {
                        "name": "g",
                        "rules": [
                            {"record": "x:y", "expr": "sum(rate(ray_llmserve_requests_total[1m])"}
                        ],
                    }
                ]
            }
        )
    )
    run = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
