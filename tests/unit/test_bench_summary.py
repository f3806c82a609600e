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


def _peers_doc() -> dict:
    return json.loads((summary.RESULTS / "peers_latest.json").read_text())


def _row(lines: list[str], lead: str) -> list[str]:
    """The cells of the table row whose first cell is `lead`."""
    line = next(line for line in lines if line.startswith(f"| {lead} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_the_peers_block_carries_goodput_under_overload_per_level_and_system():
    doc = _peers_doc()
    lines = summary._peers(doc)
    w, cap = doc["workload"], doc["capacity"]
    heading = next(line for line in lines if line.startswith("Open-loop"))
    assert f"TTFT <= {w['ttft_slo_ms']:g} ms" in heading
    assert f"TPOT <= {w['tpot_slo_ms']:g} ms" in heading
    assert f"{cap['rps']:.3g} requests/s" in heading and cap["definition"] in heading
    names = [n for n in summary.LABELS if n in doc["systems"]]
    levels = {r["load_x_capacity"] for n in names for r in doc["systems"][n]["open_loop"]}
    assert {1.0, 2.0, 4.0} <= levels
    for x in levels:
        cells = _row(lines, f"{x:g}x ({x * cap['rps']:.2f}/s)")
        for n, cell in zip(names, cells, strict=True):
            r = next(r for r in doc["systems"][n]["open_loop"] if r["load_x_capacity"] == x)
            assert cell.startswith(f"{r['goodput_rps']:.2f}")
            assert "TTFT p99" in cell
            if r["refused_share"]:
                assert f"{r['refused_share']:.0%} refused" in cell


def test_the_overload_cell_says_how_fast_a_refusal_came():
    doc = _peers_doc()
    name = next(n for n in summary.LABELS if n in doc["systems"])
    for r in doc["systems"][name]["open_loop"]:
        r.update(refused_share=0.35, refusal_p99_ms=12.4)
    x = doc["systems"][name]["open_loop"][0]["load_x_capacity"]
    cells = _row(summary._peers(doc), f"{x:g}x ({x * doc['capacity']['rps']:.2f}/s)")
    assert "35% refused in 12 ms at p99" in cells[0]


def test_the_peers_block_carries_interactive_ttft_beside_batch_and_idle():
    doc = _peers_doc()
    lines = summary._peers(doc)
    for n, entry in doc["systems"].items():
        interactive, batch = entry["mixed"]["interactive"], entry["mixed"]["batch"]
        idle = next(r for r in entry["sweep"] if r["concurrency"] == 1)
        assert _row(lines, summary.LABELS[n]) == [
            f"{interactive['ttft_p50_ms']:.0f} / {interactive['ttft_p99_ms']:.0f}",
            f"{idle['ttft_p50_ms']:.0f}",
            f"{batch['output_throughput']:.1f}",
        ]
    first = next(iter(doc["systems"].values()))["mixed"]
    assert f"beside {first['batch_clients']} batch clients" in "\n".join(lines)


def test_a_system_without_the_sections_gets_a_dash_and_none_at_all_no_table():
    doc = _peers_doc()
    failed = doc["systems"]["ray-serve-llm"]
    failed.pop("open_loop"), failed.pop("mixed"), failed.pop("sweep")
    lines = summary._peers(doc)
    names = [n for n in summary.LABELS if n in doc["systems"]]
    for x in doc["workload"]["loads_x_capacity"]:
        cells = _row(lines, f"{x:g}x ({x * doc['capacity']['rps']:.2f}/s)")
        assert cells[names.index("ray-serve-llm")] == summary.NONE
        assert cells[names.index("llmserve")] != summary.NONE
    assert _row(lines, summary.LABELS["ray-serve-llm"]) == [
        f"{summary.NONE} / {summary.NONE}",
        summary.NONE,
        summary.NONE,
    ]
    for entry in doc["systems"].values():
        entry.pop("open_loop", None), entry.pop("mixed", None)
    lines = summary._peers(doc)
    assert not any(line.startswith(("Open-loop", "Interactive")) for line in lines)
