"""Results of a run: `peers_latest.json` (earlier runs are in git's history), a markdown report in
which every figure also shows as a ratio to bare vLLM measured in the same run, and the two
plots of bench/peers/plots.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers import cpu, plots
from bench.peers.machine import cpu_label
from bench.peers.spec import BASELINE

LABELS = plots.LABELS


def write(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "latest_json": out_dir / "peers_latest.json",
        "markdown": out_dir / "peers_latest.md",
        "throughput_png": out_dir / "peers_latest_throughput.png",
        "latency_png": out_dir / "peers_latest_latency.png",
    }
    paths["latest_json"].write_text(json.dumps(results, indent=2))
    paths["markdown"].write_text(markdown(results))
    plots.throughput(results, paths["throughput_png"])
    plots.latency(results, paths["latency_png"])
    return paths


# ------------------------------------------------------------------------------------ markdown


@dataclass(frozen=True)
class Row:
    lead: list[str]  # the leading cells (level, metric)
    get: Callable[[str], Any]  # system name -> value (None: not measured)
    unit: str = ""  # "%" for shares, which get no ratio
    ratio: bool = True  # show "(x1.23)" against the baseline


def markdown(results: dict[str, Any]) -> str:
    sections = [
        _header,
        _systems_section,
        _sweep_section,
        _idle_cpu_section,
        _rounds_section,
        _open_loop_section,
        _mixed_section,
    ]
    lines = [line for section in sections for line in section(results)]
    lines += [
        f"Total run time {results.get('wall_s', 0) / 60:.1f} min. Plots: "
        "`peers_latest_throughput.png`, `peers_latest_latency.png`.",
        "",
    ]
    return "\n".join(lines)


def _header(r: dict[str, Any]) -> list[str]:
    w, m, v, model = r["workload"], r["machine"], r["versions"], r["model"]
    dirty = " (dirty)" if v["git_dirty"] else ""
    return [
        f"# Benchmarks against peers ({r['mode']} run, {r['date']})",
        "",
        f"Machine: {cpu_label(m['cpu_model'], m.get('cpu_vector_extensions'))}, "
        f"{m['physical_cores']} cores "
        f"({m['logical_cpus']} logical), "
        f"{m['ram_gib']} GiB RAM, no GPU; load average at start {r['load_average_start']}, "
        f"at end {r.get('load_average_end')}.",
        f"Versions: vLLM {v['vllm']} ({v['vllm_distribution']}), Ray {v['ray']}, torch "
        f"{v['torch']}, llmserve git {(v['git_sha'] or '?')[:10]}{dirty}.",
        f"Model `{model['name']}`; engine args for every system: "
        f"`{json.dumps(model['engine_args'])}`, VLLM_CPU_KVCACHE_SPACE="
        f"{model['kv_cache_space_gib']} GiB.",
        f"Requests: random tokens, {w['input_len']} in / {w['output_len']} out, ignore_eos, "
        f"greedy, seed {w['seed']}; {w['num_warmups']} warm-up requests per system excluded. "
        "Client: `vllm.benchmarks.serve` (streaming `/v1/completions`). Ratios: system / bare "
        "vLLM in this run (for latencies, above 1 is slower).",
        "",
    ]


def _systems_section(r: dict[str, Any]) -> list[str]:
    entry = lambda s: r["systems"][s]  # noqa: E731
    rows = [
        Row(["ready after (s)"], lambda s: entry(s).get("ready_s"), ratio=False),
        Row(["stopped in (s)"], lambda s: (entry(s).get("stop") or {}).get("stop_s"), ratio=False),
        Row(["stopped cleanly"], lambda s: _stopped(entry(s).get("stop")), ratio=False),
        Row(["process niceness"], lambda s: _niceness(entry(s)), ratio=False),
        Row(["error"], lambda s: (entry(s).get("error") or "-").splitlines()[0][:80], ratio=False),
    ]
    return ["## Systems", "", *_table(r, ["stage"], rows), ""]


def _sweep_section(r: dict[str, Any]) -> list[str]:
    rows = []
    for c in r["workload"]["concurrencies"]:

        def get(field, c=c):
            return lambda s: _lookup(r, s, "sweep", "concurrency", c, field)

        lead = str(c)
        rows += [
            Row([lead, "requests/s"], get("request_throughput")),
            Row([lead, "output tokens/s"], get("output_throughput")),
            Row([lead, "TTFT p50 (ms)"], get("ttft_p50_ms")),
            Row([lead, "TTFT p99 (ms)"], get("ttft_p99_ms")),
            Row([lead, "TPOT p50 (ms)"], get("tpot_p50_ms")),
            Row([lead, "TPOT p99 (ms)"], get("tpot_p99_ms")),
            Row([lead, "ITL p50 (ms)"], get("itl_p50_ms")),
            Row([lead, "ITL p90 (ms)"], get("itl_p90_ms")),
            Row([lead, "ITL p99 (ms)"], get("itl_p99_ms")),
            Row([lead, "not completed"], lambda s, c=c: _not_completed(r, s, c), ratio=False),
        ]
    return [
        "## (a) Concurrency sweep (closed loop)",
        "",
        "Throughput at equal served work: llmserve's sweep tenant waits in its queue as long as "
        "the loop needs, so a row with requests not completed is not a fair comparison. "
        "ITL: inter-token latency, the gap between one piece of a stream's text and the next "
        "as the client reads them (tokens that arrive together count as gaps of 0).",
        "",
        *_table(r, ["concurrency", "metric"], rows),
        "",
        *_cpu_section(r),
    ]


def _rounds_section(r: dict[str, Any]) -> list[str]:
    across = r.get("across_rounds")
    if not across:
        return []
    orders = "; ".join(
        f"{i + 2}: {', '.join(x['order'])}" for i, x in enumerate(r.get("rounds", []))
    )
    lines = [
        f"## Across {across['rounds']} rounds",
        "",
        "Each round after the first starts every system again for the sweep at these levels, "
        f"in the other order (round 1: {', '.join(r['systems'])}; {orders}). Output tokens/s "
        "per round (a level with a request not served counts as missing), the ratio to "
        f"{across['baseline']} within each round, and the median of those ratios.",
        "",
        "| streams | system | output tokens/s by round | median | ratio by round | median ratio |",
        "|---|---|---|---|---|---|",
    ]
    for c, level in across["levels"].items():
        for name, x in level.items():
            tps = " / ".join("-" if t is None else f"{t:.1f}" for t in x["output_throughput"])
            ratios = " / ".join(f"x{q:.2f}" for q in x["ratios"]) or "-"
            median = f"x{x['median_ratio']:.2f}" if x["median_ratio"] is not None else "-"
            lines.append(
                f"| {c} | {name} | {tps} | {x['median_output_throughput'] or '-'} | {ratios} | "
                f"{median} |"
            )
    return [*lines, "", *_ttft_rows(across)]


def _ttft_rows(across: dict[str, Any]) -> list[str]:
    ttft = across.get("ttft")
    if not ttft:
        return []
    lines = [
        f"TTFT p50 at {ttft['concurrency']} stream by round (ms), each round's ratio to "
        f"{across['baseline']}'s and difference, and their medians:",
        "",
        "| system | TTFT p50 by round | ratio by round | median ratio | median difference |",
        "|---|---|---|---|---|",
    ]
    for name, x in ttft.items():
        if name == "concurrency":
            continue
        ms = " / ".join("-" if t is None else f"{t:.1f}" for t in x["ttft_p50_ms"])
        ratios = " / ".join(f"x{q:.2f}" for q in x["ratios"]) or "-"
        median = "-" if x["median_ratio"] is None else f"x{x['median_ratio']:.2f}"
        diff = "-" if x["median_diff_ms"] is None else f"{x['median_diff_ms']:+.1f} ms"
        lines.append(f"| {name} | {ms} | {ratios} | {median} | {diff} |")
    return [*lines, ""]


def _cpu_section(r: dict[str, Any]) -> list[str]:
    rows = []
    for c in r["workload"]["concurrencies"]:
        for role in (*cpu.ROLES, "all_but_engine"):

            def get(s, c=c, role=role):
                per = _lookup(r, s, "sweep", "concurrency", c, "cpu_ms_per_token") or {}
                return per.get(role)

            rows.append(Row([str(c), role], get, ratio=False))
    if not any(row.get(s) for row in rows for s in r["systems"]):
        return []  # results from before the sweep read CPU
    return [
        "CPU ms per output token, by role (bench/peers/cpu.py): the engine (vLLM's engine core "
        "and workers), the frontend (the process holding vLLM's AsyncLLM and OpenAI layer), the "
        "Router or ingress, the proxy, the rest of Ray, the client. On this host all of them "
        "share the cores the engine computes on: what the others take, the engine lacks.",
        "",
        *_table(r, ["concurrency", "role"], rows),
        "",
    ]


def _idle_cpu_section(r: dict[str, Any]) -> list[str]:
    rows = [
        Row(
            [role],
            lambda s, role=role: (r["systems"][s].get("idle_cpu_pct") or {}).get(role),
            ratio=False,
        )
        for role in (*cpu.ROLES, "all_but_engine")
    ]
    if not any(row.get(s) is not None for row in rows for s in r["systems"]):
        return []  # results from before the harness measured it
    return [
        f"CPU with no request in flight, % of one core by role, over "
        f"{r['workload'].get('idle_window_s', 0):g} s after the warm-up (all_but_engine: every "
        "role but the engine and the client). A fixed cost: on this host it shares the cores with "
        "the engine at every load.",
        "",
        *_table(r, ["role"], rows),
        "",
    ]


def _open_loop_section(r: dict[str, Any]) -> list[str]:
    cap, w = r.get("capacity") or {}, r["workload"]
    if not cap.get("rps"):
        return []
    rows = []
    for x in w["loads_x_capacity"]:

        def get(field, x=x):
            return lambda s: _lookup(r, s, "open_loop", "load_x_capacity", x, field)

        lead = f"{x:g}x ({x * cap['rps']:.2f}/s)"
        rows += [
            Row([lead, "goodput (req/s)"], get("goodput_rps")),
            Row([lead, "good share"], get("good_share"), "%"),
            Row([lead, "TTFT p50 (ms)"], get("ttft_p50_ms")),
            Row([lead, "TTFT p99 of completed (ms)"], get("ttft_p99_ms")),
            Row([lead, "refused (429/503)"], get("refused_share"), "%"),
            Row([lead, "time to a refusal p99 (ms)"], get("refusal_p99_ms")),
            Row([lead, "errors"], get("error_share"), "%"),
        ]
    return [
        "## (b) Open-loop Poisson load",
        "",
        f"Capacity {cap['rps']:.3g} requests/s: {cap['definition']} Every system gets the same "
        f"offered rates. Goodput: completed requests with TTFT <= {w['ttft_slo_ms']:g} ms and "
        f"TPOT <= {w['tpot_slo_ms']:g} ms, per second from the first request sent to the last "
        "one finished (vLLM's `--goodput`); good share: the same count over all requests "
        "offered. Refused: 429/503.",
        "",
        *_table(r, ["offered load", "metric"], rows),
        "",
    ]


def _mixed_section(r: dict[str, Any]) -> list[str]:
    measured = [r["systems"][s]["mixed"] for s in plots.systems(r) if r["systems"][s].get("mixed")]
    if not measured:
        return []
    mx, w = measured[0], r["workload"]

    def get(cls, field):
        return lambda s: ((r["systems"][s].get("mixed") or {}).get(cls) or {}).get(field)

    rows = [
        Row(["interactive", "TTFT p50 (ms)"], get("interactive", "ttft_p50_ms")),
        Row(["interactive", "TTFT p99 (ms)"], get("interactive", "ttft_p99_ms")),
        Row(["interactive", "completed"], get("interactive", "completed"), ratio=False),
        Row(["interactive", "refused"], get("interactive", "refused_share"), "%"),
        Row(["batch", "TTFT p50 (ms)"], get("batch", "ttft_p50_ms")),
        Row(["batch", "TTFT p99 (ms)"], get("batch", "ttft_p99_ms")),
        Row(["batch", "output tokens/s"], get("batch", "output_throughput")),
        Row(["batch", "refused"], get("batch", "refused_share"), "%"),
    ]
    return [
        "## (c) Interactive and batch at saturation",
        "",
        f"{mx['batch_clients']} batch clients in a closed loop ({w['output_len']} tokens each) "
        "keep more requests outstanding than the engine runs at once; once their first wave is "
        f"through, interactive requests ({w['mixed_interactive_output_len']} tokens) arrive at "
        f"{mx['interactive_rps']:g}/s for {w['mixed_window_s']:g} s. Batch figures: requests "
        "sent in that window. llmserve knows the classes from the tenants' API keys (priority "
        "interactive / batch); the peers get the same requests and cannot tell them apart.",
        "",
        *_table(r, ["class", "metric"], rows),
        "",
    ]


def _table(results: dict[str, Any], head: list[str], rows: list[Row]) -> list[str]:
    systems = plots.systems(results)
    lines = [
        "| " + " | ".join(head + [LABELS.get(s, s) for s in systems]) + " |",
        "|" + "---|" * (len(head) + len(systems)),
    ]
    for row in rows:
        base = row.get(BASELINE) if BASELINE in systems else None
        cells = [_cell(row.get(s), base, row.unit, row.ratio and s != BASELINE) for s in systems]
        lines.append("| " + " | ".join(row.lead + cells) + " |")
    return lines


def _cell(value: Any, base: Any, unit: str, ratio: bool) -> str:
    text = _fmt(value, unit)
    if ratio and unit != "%" and isinstance(value, (int, float)) and base not in (None, 0):
        text += f" (x{value / base:.2f})"
    return text


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "%":
        return f"{100 * v:.0f}%"
    if isinstance(v, float):
        v = f"{v:.3g}" if abs(v) < 10 else f"{v:.0f}"
    return f"{v}{unit}"


def _lookup(results, system: str, scenario: str, key: str, value: Any, field: str) -> Any:
    for row in results["systems"].get(system, {}).get(scenario) or []:
        if row.get(key) == value:
            return row.get(field)
    return None


def _stopped(stop: dict[str, Any] | None) -> str:
    if not stop:
        return "-"
    text = "yes" if stop["clean"] else "NO"
    if stop["killed"]:  # stragglers the harness had to SIGKILL after the grace period
        text += f" ({len(stop['killed'])} killed)"
    return text


def _niceness(entry: dict[str, Any]) -> str:
    """Distinct nice values of the system's processes (Ray runs its workers at 15; the client
    runs at 0 beside them on the same cores)."""
    values = sorted({p["nice"] for p in entry.get("processes", []) if "nice" in p})
    return ", ".join(map(str, values)) or "-"


def _not_completed(results, system: str, c: int) -> Any:
    done = _lookup(results, system, "sweep", "concurrency", c, "completed")
    total = _lookup(results, system, "sweep", "concurrency", c, "requests")
    return None if done is None else total - done
