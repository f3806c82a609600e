"""bench/results/relay_cost.md from relay_cost.json: the per-token CPU table by process, the
refusal bursts and what each option is (bench.relay_cost and bench.options write it)."""

from __future__ import annotations


def render(doc: dict, source: str = "relay_cost.json") -> str:
    lines = [
        "# Relay cost at GPU rates (`python -m bench.relay_cost`)",
        "",
        f"Generated from {source}: commit {doc['commit']}, {doc['date']}, "
        f"{doc['machine']}. Simulated engine, {doc['rate_per_stream']:g} tokens/s per stream, "
        f"{doc['max_tokens']}-token streamed completions; CPU per delivered token over the "
        "middle half of each run (ms), median of the rounds (systems interleaved). `path` = "
        "proxy + Router + replica; `proxy` = HAProxy where it runs, plus Serve's proxy actor.",
        "",
        "| system | streams | offered tok/s | delivered tok/s | proxy | Router | replica | "
        "controller | Ray other | path | all | TTFT p50 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in doc["systems"]:
        for r in s["runs"]:
            ms = r["cpu_ms_per_token"]
            lines.append(
                f"| {s['name']} | {r['streams']} | {r['offered_tokens_per_s']} | "
                f"{r['delivered_tokens_per_s']} | {ms['proxy']:.3f} | {ms['router']:.3f} | "
                f"{ms['replica']:.3f} | {ms['controller']:.3f} | {ms['ray_other']:.3f} | "
                f"{r['cpu_ms_per_token_path']:.3f} | {r['cpu_ms_per_token_all']:.3f} | "
                f"{r['ttft_p50_ms']} | {r['errors']} |"
            )
    lines += [
        "",
        "A burst of requests at once from a tenant allowed 1 request/s (burst 4), "
        "each round; CPU per request over the burst (ms):",
        "",
        "| system | sent | refused (429/503) | served | p50 ms | p99 ms | proxy | Router |"
        " replica | proxy + Router |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in doc["systems"]:
        for b in s.get("refusals", []):
            ms = b["cpu_ms_per_request"]
            lines.append(
                f"| {s['name']} | {b['sent']} | {b['refused']} | "
                f"{b['statuses'].get('200', b['statuses'].get(200, 0))} | {b['p50_ms']} | "
                f"{b['p99_ms']} | {ms['proxy']:.3f} | {ms['router']:.3f} | "
                f"{ms['replica']:.3f} | {b['cpu_ms_per_request_path']:.3f} |"
            )
    lines += ["", "Systems:", ""] + [f"- `{s['name']}`: {s['what']}" for s in doc["systems"]]
    return "\n".join(lines) + "\n"
