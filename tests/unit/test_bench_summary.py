"""The README's figures are the benchmarks' results files, rendered: none typed by hand."""

from __future__ import annotations

import json

from bench import summary
from bench.prefix_routing_report import command


def test_readme_block_is_the_rendered_results():
    text = summary.README.read_text()
    block = text.split(summary.BEGIN, 1)[1].split(summary.END, 1)[0]
    assert block.strip() == summary.render().strip()


def test_prefix_rows_come_from_the_results_file():
    doc = json.loads((summary.RESULTS / "prefix_routing.json").read_text())
    lines = summary._prefix(doc)
    table = [line for line in lines if line.startswith("| ") and "%" in line]
    assert len(table) == sum(1 for run in doc["routers"].values() if run.get("chat"))
    chat = doc["routers"]["prefix-aware"]["chat"]
    assert f"{chat['hit_rate']:.1%}" in table[0]
    assert f"{chat['ttft_p50_ms']:.0f} / {chat['ttft_p99_ms']:.0f}" in table[0]


def test_a_result_names_the_command_that_reproduces_it():
    workload = {"sessions": 8, "think_s": 4.0, "replica_cores": ["0", "1"], "routers": None}
    assert command(workload) == (
        "python -m bench.prefix_routing --sessions 8 --think-s 4.0 --replica-cores 0 1"
    )


def test_the_floor_line_comes_from_its_results_file():
    doc = json.loads((summary.RESULTS / "relay_floor.json").read_text())
    (line,) = summary._floor(doc)
    floor = next(s for s in doc["systems"] if s["name"] == "serve-floor")
    for burst in floor["refusals"]:
        assert f"{burst['cpu_ms_per_request_path']:.2f}" in line
    for run in floor["runs"]:
        assert f"{run['cpu_ms_per_token']['router']:.3f} at {run['streams']}" in line
    assert doc["commit"] in line and doc["machine"] in line
