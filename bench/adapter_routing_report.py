"""The report of `python -m bench.adapter_routing` (its module docstring says what is
measured), and the names of the adapters and systems it reports on."""

from __future__ import annotations

import statistics
from typing import Any

from bench import adapter_routing_ray as ray_llm

ADAPTERS = [f"bench-lora-{i}" for i in range(1, 9)]
ROUTERS = {"adapter-aware": {"adapter_weight": 4.0}, "load-only": {"adapter_weight": 0.0}}
SYSTEMS = [*ROUTERS, ray_llm.NAME]
SPREAD_REQUESTS, SPREAD_CONCURRENCY = 36, 12


def _pair(t: dict | None) -> str:
    return f"{t['p50']} / {t['p99']}" if t else "n/a"


def _na(v: Any) -> Any:
    return "n/a" if v is None else v


def _row(name: str, r: dict[str, Any]) -> str:
    if r.get("error"):
        return f"| {name} | error: {r['error']} | | | | | | |"
    hottest = r["hottest_by_replica"]
    return (
        f"| {name} | {_na(r['loads_per_1000'])} | {_pair(r.get('ttft_s'))} | "
        f"{_pair(r['ttft_held_s'])} | {_pair(r['ttft_loaded_s'])} | {r['tokens_per_s']} | "
        f"{r['failed']} | {r['hottest_adapter']}: {_na(hottest)} |"
    )


def _ratio_lines(routers: dict[str, Any], rounds: list[dict] | None = None) -> list[str]:
    aware, blind, ray = (routers.get(k, {}) for k in SYSTEMS)
    lines = []
    if aware.get("loads_per_1000") is not None and blind.get("loads_per_1000"):
        ratio = aware["loads_per_1000"] / blind["loads_per_1000"]
        lines.append(f"Loads, adapter-aware against load-only: x{ratio:.2f}.")
    ratios = round_ratios(rounds or [{k: r.get("tokens_per_s") for k, r in routers.items()}])
    if len(ratios) == 1:
        lines.append(f"tokens/s, adapter-aware against Ray Serve LLM: x{ratios[0]:.2f}.")
    elif ratios:
        by_round = " / ".join(f"x{r:.2f}" for r in ratios)
        lines.append(
            f"tokens/s, adapter-aware against Ray Serve LLM, by round: {by_round}; median "
            f"x{statistics.median(ratios):.2f}."
        )
    return ["", *lines] if lines else []


def round_ratios(rounds: list[dict[str, float | None]]) -> list[float]:
    """Adapter-aware's tokens/s over Ray Serve LLM's, for each round where both served."""
    aware, ray = SYSTEMS[0], ray_llm.NAME
    return [r[aware] / r[ray] for r in rounds if r.get(aware) and r.get(ray)]


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Adapter-aware routing",
        "",
        f"Commit {doc['commit']}, {doc['date']}, {doc['machine']}. Written by "
        "`python -m bench.adapter_routing` from adapter_routing.json.",
        "",
        f"Two replicas of {doc['model']}, {len(ADAPTERS)} LoRA adapters (random, rank 8), "
        f"`max_loras` 2, `max_cpu_loras` {doc['workload'].get('max_cpu_loras', 2)}; "
        f"{doc['workload']['requests']} streamed completions "
        f"of {doc['workload']['max_tokens']} tokens, {doc['workload']['concurrency']} at once, "
        f"adapters drawn Zipf(s={doc['workload']['zipf_s']}); each system the same requests.",
        "",
        "| router | loads / 1,000 requests | TTFT p50 / p99, all (s) | TTFT p50 / p99, adapter "
        "held (s) | TTFT p50 / p99, loaded first (s) | tokens/s | failed | hottest adapter by "
        "replica |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(name, r) for name, r in doc["routers"].items()]
    spreads = {k: r["spread"] for k, r in doc["routers"].items() if r.get("spread")}
    if spreads:
        lines += [
            "",
            f"Spread: the coldest adapter loaded by one request, then {SPREAD_REQUESTS} requests "
            f"for it, {SPREAD_CONCURRENCY} at once.",
            "",
            "| router | adapter | first token from a second replica after (s) | replies by "
            "replica | failed |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {v['adapter']} | {v['second_replica_after_s']} | {v['by_replica']} | "
            f"{v['failed']} |"
            for k, v in spreads.items()
        ]
    if len(doc.get("rounds", [])) > 1:
        names = list(doc["rounds"][0])
        lines += [
            "",
            "tokens/s by round (round 1 is the table above; each later round starts the two "
            "systems again, in the other order every other round):",
            "",
            "| round | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        lines += [
            f"| {i} | " + " | ".join(str(_na(r.get(n))) for n in names) + " |"
            for i, r in enumerate(doc["rounds"], 1)
        ]
    lines += _ratio_lines(doc["routers"], doc.get("rounds"))
    lines += [
        "",
        "A load is a request sent to an engine whose replica had not reported the adapter held "
        "(its report is at most ~1.5 s old); the engine loads it from disk first, evicting the "
        "least recently used.",
    ]
    if ray_llm.NAME in doc["routers"]:
        lines += [
            "",
            f"{ray_llm.NAME}: Ray Serve LLM {doc.get('ray_version', '')}, its default routing "
            "(power of two choices, preferring replicas that hold the adapter), adapters "
            "downloaded from a local S3 stand-in (moto); `max_num_adapters_per_replica` = "
            "`max_cpu_loras`. Its loads are Ray's `serve_multiplexed_models_load_counter` (a "
            "replica adding the adapter to its multiplexed set); its replies do not name their "
            "replica, hence n/a.",
        ]
    return "\n".join(lines) + "\n"
