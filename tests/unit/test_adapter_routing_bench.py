"""bench/adapter_routing.py's pure parts for its third system, Ray Serve LLM: the S3 stand-in's
object layout, Ray's load counter as read from its metrics export, and the figures of a run
whose replies do not say their replica."""

from __future__ import annotations

from bench import adapter_routing as ar
from bench import adapter_routing_ray as rl
from bench import adapter_routing_report as report
from bench.client import Reply
from bench.s3_standin import aws_env, object_keys


def test_object_keys_one_subfolder_per_adapter(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "adapter_config.json").write_text("{}")
        (tmp_path / name / "sub" / "w.bin").write_text("")
        (tmp_path / name / ".lock").write_text("")  # hidden files stay behind
    keys = object_keys({"lora-a": tmp_path / "a", "lora-b": tmp_path / "b"}, prefix="p")
    assert sorted(keys) == [
        "p/lora-a/adapter_config.json",
        "p/lora-a/sub/w.bin",
        "p/lora-b/adapter_config.json",
        "p/lora-b/sub/w.bin",
    ]


def test_aws_env_points_boto3_and_pyarrow_at_the_endpoint():
    env = aws_env("http://127.0.0.1:9")
    assert env["AWS_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9"
    assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]


def test_counter_sum_adds_every_replica_and_skips_other_series():
    text = "\n".join(
        [
            "# TYPE ray_serve_multiplexed_models_load_counter_total counter",
            'ray_serve_multiplexed_models_load_counter_total{replica="a"} 3.0',
            'ray_serve_multiplexed_models_load_counter_total{replica="b"} 4.0',
            'ray_serve_multiplexed_models_unload_counter_total{replica="a"} 9.0',
        ]
    )
    assert rl.counter_sum(text) == 7.0
    assert rl.counter_sum("") == 0.0


def test_model_id_is_base_colon_adapter():
    assert rl.model_id("smollm2", "bench-lora-1") == "smollm2:bench-lora-1"


def test_summarize_without_route_headers_leaves_routing_figures_out():
    replies = [
        ("bench-lora-1", Reply(start_s=0, status=200, done=True, ttft_s=0.5, completion_tokens=16)),
        ("bench-lora-2", Reply(start_s=0, status=200, done=True, ttft_s=1.5, completion_tokens=16)),
        ("bench-lora-2", Reply(start_s=0, status=503)),
    ]
    s = ar.summarize(replies, span_s=2.0)
    assert (s["failed"], s["tokens_per_s"]) == (1, 16.0)
    assert s["ttft_s"] == {"p50": 1.5, "p99": 1.5}
    assert s["loads_per_1000"] is s["ttft_held_s"] is s["hottest_by_replica"] is None
    row = report._row("ray-serve-llm", {**s, "loads_per_1000": None})
    assert "| n/a | 1.5 / 1.5 | n/a | n/a | 16.0 | 1 |" in row


def test_tokens_ratio_line():
    routers = {"adapter-aware": {"tokens_per_s": 20.0}, rl.NAME: {"tokens_per_s": 10.0}}
    assert "tokens/s, adapter-aware against Ray Serve LLM: x2.00." in report._ratio_lines(routers)


def test_rounds_ratio_line_is_the_median_of_rounds_where_both_served():
    routers = {"adapter-aware": {"tokens_per_s": 9.0}, "ray-serve-llm": {"tokens_per_s": 10.0}}
    rounds = [
        {"adapter-aware": 9.0, "load-only": 9.5, "ray-serve-llm": 10.0},
        {"ray-serve-llm": 10.0, "adapter-aware": 11.0},
        {"adapter-aware": 12.0, "ray-serve-llm": None},  # Ray failed: no ratio
        {"adapter-aware": 10.5, "ray-serve-llm": 10.0},
    ]
    line = report._ratio_lines(routers, rounds)[-1]
    assert line == (
        "tokens/s, adapter-aware against Ray Serve LLM, by round: x0.90 / x1.10 / x1.05; "
        "median x1.05."
    )
