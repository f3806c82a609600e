"""The peers benchmark's rounds (bench/peers/rounds.py): the order of each round, and the median
of each round's own ratio, with a level that did not serve every request left out."""

from __future__ import annotations

import pytest

from bench.peers import report, rounds
from tests.unit.test_bench_peers import _results


def _sweep(**tok_s_by_level) -> list[dict]:
    return [
        {"concurrency": int(c[1:]), "requests": 32, "completed": 32, "output_throughput": tp}
        for c, tp in tok_s_by_level.items()
    ]


@pytest.mark.parametrize(
    "number, expected",
    [(1, ["a", "b", "c"]), (2, ["c", "b", "a"]), (3, ["a", "b", "c"]), (4, ["c", "b", "a"])],
)
def test_every_other_round_runs_the_systems_in_reverse(number, expected):
    assert rounds.order(number, ["a", "b", "c"]) == expected


def test_the_median_is_of_ratios_within_each_round():
    # The host slows down between rounds; within each round llmserve is at 0.9-1.0 of vLLM.
    runs = [
        {"vllm": _sweep(c16=50.0), "llmserve": _sweep(c16=50.0)},
        {"vllm": _sweep(c16=40.0), "llmserve": _sweep(c16=36.0)},
        {"vllm": _sweep(c16=60.0), "llmserve": _sweep(c16=57.0)},
    ]
    level = rounds.summarize(runs, "vllm", levels=[16])["levels"]["16"]
    assert level["llmserve"]["ratios"] == [1.0, 0.9, 0.95]
    assert level["llmserve"]["median_ratio"] == 0.95
    assert level["llmserve"]["median_output_throughput"] == 50.0
    assert level["vllm"]["median_ratio"] is None  # the baseline has no ratio to itself


def test_a_level_with_a_request_not_served_is_not_a_sample():
    refused = _sweep(c64=80.0)
    refused[0]["completed"] = 31
    runs = [
        {"vllm": _sweep(c64=60.0), "llmserve": refused},
        {"vllm": _sweep(c64=60.0), "llmserve": _sweep(c64=54.0)},
        {"vllm": None, "llmserve": _sweep(c64=66.0)},  # vLLM failed that round
    ]
    x = rounds.summarize(runs, "vllm", levels=[64])["levels"]["64"]["llmserve"]
    assert x["output_throughput"] == [None, 54.0, 66.0]
    assert x["ratios"] == [0.9]
    assert x["median_ratio"] == 0.9


def test_the_report_shows_each_round_and_the_median():
    results = _results()
    results["rounds"] = [{"round": 2, "order": ["vllm", "llmserve"], "systems": {}}]
    results["across_rounds"] = rounds.summarize(
        [
            {"vllm": _sweep(c16=50.0), "llmserve": _sweep(c16=45.0)},
            {"vllm": _sweep(c16=50.0), "llmserve": _sweep(c16=55.0)},
        ],
        "vllm",
        levels=[16],
    )
    md = report.markdown(results)
    assert "## Across 2 rounds" in md
    assert "| 16 | llmserve | 45.0 / 55.0 | 50.0 | x0.90 / x1.10 | x1.00 |" in md


def _one_stream(ttft_ms: float, completed: int = 20) -> list[dict]:
    return [{"concurrency": 1, "requests": 20, "completed": completed, "ttft_p50_ms": ttft_ms}]


def test_one_streams_first_token_is_the_median_of_each_rounds_own_ratio():
    # The host drifts by ~20 ms between rounds; within each round llmserve is 5-13 ms slower.
    runs = [
        {"vllm": _one_stream(105.5), "llmserve": _one_stream(118.8)},
        {"vllm": _one_stream(124.0), "llmserve": _one_stream(129.0)},
        {"vllm": _one_stream(110.0), "llmserve": _one_stream(117.0)},
        {"vllm": _one_stream(100.0), "llmserve": _one_stream(90.0, completed=19)},  # not a sample
    ]
    ttft = rounds.summarize(runs, "vllm", levels=[16])["ttft"]
    x = ttft["llmserve"]
    assert x["ttft_p50_ms"] == [118.8, 129.0, 117.0, None]
    assert x["ratios"] == [1.126, 1.04, 1.064]
    assert x["median_ratio"] == 1.064
    assert x["diffs_ms"] == [13.3, 5.0, 7.0] and x["median_diff_ms"] == 7.0
    assert ttft["vllm"]["median_ratio"] is None
    assert ttft["concurrency"] == 1


def test_no_round_at_one_stream_gives_no_first_token_summary():
    runs = [{"vllm": _sweep(c16=50.0), "llmserve": _sweep(c16=45.0)}]
    assert rounds.summarize(runs, "vllm", levels=[16])["ttft"] == {}


def test_the_report_and_the_readme_give_the_first_tokens_median():
    from bench import summary

    results = _results()
    results["rounds"] = [{"round": 2, "order": ["vllm", "llmserve"], "systems": {}}]
    results["across_rounds"] = rounds.summarize(
        [
            {
                "vllm": _sweep(c16=50.0) + _one_stream(100.0),
                "llmserve": _sweep(c16=45.0) + _one_stream(112.0),
            },
            {
                "vllm": _sweep(c16=50.0) + _one_stream(120.0),
                "llmserve": _sweep(c16=55.0) + _one_stream(126.0),
            },
        ],
        "vllm",
        levels=[16],
    )
    md = report.markdown(results)
    assert "| llmserve | 112.0 / 126.0 | x1.12 / x1.05 | x1.08 | +9.0 ms |" in md
    readme = "\n".join(summary._peers(results))
    assert "TTFT p50 at one stream, the median of the rounds': llmserve x1.08 (+9.0 ms)" in readme
