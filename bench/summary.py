"""The README's performance summary, written from the benchmarks' results files.

    .venv/bin/python -m bench.summary     # rewrites the block between the README's markers

Reads bench/results/relay_cost.json (bench.relay_cost), peers_latest.json (make bench) and
prefix_routing.json (bench.prefix_routing); each figure carries the commit, date and machine of
the run that measured it. Each of those benchmarks calls it after writing its results to
bench/results, so the README never holds a figure typed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.peers.machine import cpu_label
from bench.peers.report import _lookup
from bench.peers.spec import LABELS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- summary:begin (bench/summary.py) -->", "<!-- summary:end -->"


def _relay(doc: dict) -> list[str]:
    by_name = {s["name"]: s for s in doc["systems"]}
    this, before = by_name.get("this"), by_name.get("before")
    if this is None:
        return []
    lines = [
        f"Relay cost at GPU rates (`python -m bench.relay_cost`, simulated engine at "
        f"{doc['rate_per_stream']:g} tokens/s a stream; commit {doc['commit']}, "
        f"{doc['date']}, {doc['machine']}), CPU ms per streamed token:",
        "",
        "| streams | system | delivered tok/s | proxy + Router + replica | Router | all of Ray |",
        "|---|---|---|---|---|---|",
    ]
    for run in this["runs"]:
        rows = [("this", run)]
        if before:
            rows += [("before", r) for r in before["runs"] if r["streams"] == run["streams"]]
        for name, r in rows:
            lines.append(
                f"| {r['streams']} | {name} | {r['delivered_tokens_per_s']} | "
                f"{r['cpu_ms_per_token_path']:.3f} | {r['cpu_ms_per_token']['router']:.3f}"
                f" | {r['cpu_ms_per_token_all']:.3f} |"
            )
    bursts = this.get("refusals") or []
    if bursts:
        b = bursts[-1]
        lines += [
            "",
            f"{b['sent']} requests at once from a tenant allowed 1/s: {b['refused']} "
            f"refused, p99 {b['p99_ms']} ms, {b['cpu_ms_per_request_path']:.3f} ms of "
            "proxy + Router CPU a request.",
        ]
    return lines


def _floor(doc: dict) -> list[str]:
    """One sentence: Serve's ingress with none of the platform's work, beside the platform."""
    by_name = {s["name"]: s for s in doc["systems"]}
    floor, this = by_name.get("serve-floor"), by_name.get("this")
    if floor is None or this is None:
        return []

    def refusal(s: dict) -> str:
        return " / ".join(f"{b['cpu_ms_per_request_path']:.2f}" for b in s["refusals"])

    def token(s: dict) -> str:
        return ", ".join(
            f"{r['cpu_ms_per_token']['router']:.3f} at {r['streams']}" for r in s["runs"]
        )

    return [
        "Ray Serve's ingress with none of the platform's work in it (`python -m "
        "bench.relay_cost --floor --out bench/results/relay_floor.json`, `serve-floor`; commit "
        f"{doc['commit']}, {doc['date']}, {doc['machine']}): a refusal {refusal(floor)} ms of "
        f"proxy + ingress CPU by round (the platform: {refusal(this)}), a streamed token "
        f"{token(floor)} streams in the ingress (the platform's Router: {token(this)})."
    ]


def _peers(doc: dict) -> list[str]:
    systems = doc["systems"]
    names = [n for n in LABELS if n in systems]

    def at(name: str, concurrency: int) -> dict:
        return next(
            (r for r in systems[name].get("sweep") or [] if r["concurrency"] == concurrency), {}
        )

    machine = doc.get("machine") or {}
    dtype = ((doc.get("model") or {}).get("engine_args") or {}).get("dtype", "?")
    exts = machine.get("cpu_vector_extensions")  # recorded from eea66f2 on
    cpu = cpu_label(machine.get("cpu_model", "?"), exts)
    lines = [
        f"Against the peers on the real default model (`make bench`; git "
        f"{doc['versions'].get('git_sha', '?')[:10]}, {doc['date']}, "
        f"{cpu}, {machine.get('logical_cpus', '?')} logical CPUs, "
        f"engine dtype {dtype}), one after the other on that machine:",
        "",
        "| | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in (16, 64):
        cells = []
        for n in names:
            r = at(n, c)
            base = at("vllm", c).get("output_throughput")
            ratio = f" (x{r['output_throughput'] / base:.2f})" if r and base and n != "vllm" else ""
            refused = f", {r['refused_share']:.0%} refused" if r.get("refused_share") else ""
            cells.append(f"{r.get('output_throughput', '-')}{ratio}{refused}")
        lines.append(f"| output tokens/s at {c} streams | " + " | ".join(cells) + " |")
    cells = [f"{at(n, 1).get('ttft_p50_ms', '-')}" for n in names]
    lines.append("| TTFT p50 at 1 stream (ms) | " + " | ".join(cells) + " |")
    for c in (1, 16, 64):
        # Recorded from the run that added the gaps between pieces of text (44) on.
        if any("itl_p50_ms" in at(n, c) for n in names):
            cells = [
                " / ".join(f"{at(n, c).get(f'itl_{q}_ms', '-')}" for q in ("p50", "p90", "p99"))
                for n in names
            ]
            lines.append(
                f"| inter-token latency p50 / p90 / p99 at {c} stream{'s' * (c > 1)} (ms) | "
                + " | ".join(cells)
                + " |"
            )
    across = doc.get("across_rounds")
    if across:
        levels = list(across["levels"])

        def median(n: str, c: str) -> str:
            q = (across["levels"][c].get(n) or {}).get("median_ratio")
            return "-" if q is None else f"x{q:.2f}"

        medians = [
            f"{LABELS[n]} {' / '.join(median(n, c) for c in levels)}"
            for n in names
            if n != across["baseline"]
        ]
        lines += [
            "",
            f"Median of {across['rounds']} rounds' ratios to bare vLLM at {' / '.join(levels)} "
            f"streams (the order reversed in every other round; bench/results/peers_latest.md): "
            f"{', '.join(medians)}.",
        ]
        ttft = {n: x for n, x in across.get("ttft", {}).items() if n in names}
        firsts = [
            f"{LABELS[n]} x{x['median_ratio']:.2f} ({x['median_diff_ms']:+.1f} ms)"
            for n, x in ttft.items()
            if x["median_ratio"] is not None
        ]
        if firsts:
            lines[-1] += f" TTFT p50 at one stream, the median of the rounds': {', '.join(firsts)}."
    for section in (_overload(doc, names), _beside_batch(doc, names)):
        if section:
            lines += ["", *section]
    return lines


NONE = "—"  # a system whose run failed or lacks the section


def _ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _overload(doc: dict, names: list[str]) -> list[str]:
    """Goodput under open-loop Poisson load at each multiple of capacity (make bench's (b))."""
    cap, w = doc.get("capacity") or {}, doc["workload"]
    levels = sorted(
        {r["load_x_capacity"] for n in names for r in doc["systems"][n].get("open_loop") or []}
    )
    if not cap.get("rps") or not levels:
        return []

    def cell(n: str, x: float) -> str:
        def get(field: str):
            return _lookup(doc, n, "open_loop", "load_x_capacity", x, field)

        goodput = get("goodput_rps")
        if goodput is None:
            return NONE
        notes = []
        if get("refused_share"):
            answered = get("refusal_p99_ms")  # recorded from the run after 5163c92 on
            notes.append(
                f"{get('refused_share'):.0%} refused"
                + (f" in {_ms(answered)} at p99" if answered is not None else "")
            )
        if get("error_share"):
            notes.append(f"{get('error_share'):.0%} errors")
        if get("ttft_p99_ms") is not None:
            notes.append(f"TTFT p99 {_ms(get('ttft_p99_ms'))}")
        return f"{goodput:.2f}" + (f" ({', '.join(notes)})" if notes else "")

    lines = [
        f"Open-loop Poisson load, goodput in requests/s (completed with TTFT <= "
        f"{w['ttft_slo_ms']:g} ms and TPOT <= {w['tpot_slo_ms']:g} ms, per second of the run; "
        "in brackets the share refused with 429/503, how fast a refusal came (p99), and the "
        "TTFT p99 of the requests "
        f"completed) at multiples of capacity, {cap['rps']:.3g} requests/s: "
        f"{cap.get('definition', '')}",
        "",
        "| offered load | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for x in levels:
        cells = [cell(n, x) for n in names]
        lines.append(f"| {x:g}x ({x * cap['rps']:.2f}/s) | " + " | ".join(cells) + " |")
    return lines


def _beside_batch(doc: dict, names: list[str]) -> list[str]:
    """Interactive TTFT while batch clients saturate the engine (make bench's (c)), beside
    the TTFT of one stream on an idle engine."""
    mixed = {n: doc["systems"][n].get("mixed") for n in names}
    first = next((m for m in mixed.values() if m), None)
    if first is None:
        return []
    w = doc["workload"]

    def get(n: str, cls: str, field: str, fmt: str = "{:.0f}") -> str:
        v = ((mixed[n] or {}).get(cls) or {}).get(field)
        return NONE if v is None else fmt.format(v)

    def idle(n: str) -> str:
        v = _lookup(doc, n, "sweep", "concurrency", 1, "ttft_p50_ms")
        return NONE if v is None else f"{v:.0f}"

    lines = [
        f"Interactive requests ({w.get('mixed_interactive_output_len', '?')} tokens, "
        f"{first['interactive_rps']:.2g}/s) beside {first['batch_clients']} batch clients "
        "saturating the engine, against one stream on an idle engine (llmserve tells the "
        "classes apart by API key; the peers cannot):",
        "",
        "| system | interactive TTFT p50 / p99 beside batch (ms) | TTFT p50 idle, 1 stream (ms) "
        "| batch output tokens/s |",
        "|---|---|---|---|",
    ]
    for n in names:
        lines.append(
            f"| {LABELS[n]} | {get(n, 'interactive', 'ttft_p50_ms')} / "
            f"{get(n, 'interactive', 'ttft_p99_ms')} | {idle(n)} | "
            f"{get(n, 'batch', 'output_throughput', '{:.1f}')} |"
        )
    return lines


def _prefix(doc: dict) -> list[str]:
    label = {
        "prefix-aware": "llm_aware, prefix-aware",
        "p2c": "llm_aware, load only (P2C)",
        "ray-prefix-affinity": "Ray's PrefixCacheAffinityRouter",
        "one-replica": "one replica (the ideal hit rate)",
    }
    routers = doc["routers"]
    ideal = (routers.get("one-replica", {}).get("chat") or {}).get("hit_rate")
    cores = doc["workload"].get("replica_cores")
    how = "python -m bench.prefix_routing"
    if cores:
        how += " --replica-cores " + " ".join(cores)
    lines = [
        f"Prefix-aware routing, multi-turn chat on {routers['prefix-aware']['replicas']} "
        f"replicas of the default model (`{how}`; commit {doc['commit']}, {doc['date']}, "
        f"{doc['machine']}; bench/results/prefix_routing.md):",
        "",
        "| router | prefix-cache hit rate (of ideal) | TTFT p50 / p99 ms | requests per replica |",
        "|---|---|---|---|",
    ]
    for name, run in routers.items():
        chat = run.get("chat")
        if not chat:
            continue
        of_ideal = f" ({chat['hit_rate'] / ideal:.0%})" if ideal else ""
        lines.append(
            f"| {label.get(name, name)} | {chat['hit_rate']:.1%}{of_ideal} | "
            f"{chat['ttft_p50_ms']:.0f} / {chat['ttft_p99_ms']:.0f} | "
            f"{chat['requests_by_replica']} |"
        )
    hot = [
        f"{label.get(name, name)} {run['hot']['requests_by_replica']} "
        f"(TTFT p99 {run['hot']['ttft_p99_ms']:.0f} ms)"
        for name, run in routers.items()
        if run.get("hot")
    ]
    if hot:
        w = doc["workload"]
        lines += [
            "",
            f"Hot prefix ({w['hot_requests']} requests, {w['hot_concurrency']} at once, one "
            "shared prompt), requests per replica: " + "; ".join(hot) + ".",
        ]
    return lines


def render() -> str:
    parts = []
    for name, fn in (
        ("relay_cost.json", _relay),
        ("relay_floor.json", _floor),
        ("peers_latest.json", _peers),
        ("prefix_routing.json", _prefix),
    ):
        path = RESULTS / name
        if path.exists():
            parts.append("\n".join(fn(json.loads(path.read_text()))))
    return "\n\n".join(p for p in parts if p)


def update_readme() -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        return
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{render()}\n{END}{tail}")


if __name__ == "__main__":
    update_readme()
    print(render())
