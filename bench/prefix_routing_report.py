"""bench/results/prefix_routing.md from prefix_routing.json, and the figures of one workload's
requests: hit rate, TTFT, spread over replicas, queue and load gaps (bench.prefix_routing)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass
class Turn:
    scenario: str
    session: int
    turn: int
    status: int
    start_s: float
    end_s: float
    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int
    replica: str
    route: str


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(q * len(s)))], 1)


def max_queue_gap(turns: list[Turn]) -> int:
    """The largest difference, at any moment, between the replicas' in-flight requests (as the
    client saw them: sent and not yet finished)."""
    replicas = sorted({t.replica for t in turns if t.replica})
    if len(replicas) < 2:
        return 0
    events = sorted((x, d, t.replica) for t in turns for x, d in ((t.start_s, 1), (t.end_s, -1)))
    current = dict.fromkeys(replicas, 0)
    gap = 0
    for _, d, replica in events:
        if replica in current:
            current[replica] += d
            gap = max(gap, max(current.values()) - min(current.values()))
    return gap


def summary(turns: list[Turn]) -> dict[str, Any]:
    ok = [t for t in turns if t.status == 200]
    prompt = sum(t.prompt_tokens for t in ok)
    ttfts = [t.ttft_s for t in ok if t.ttft_s is not None]
    by_replica: dict[str, int] = {}
    for t in ok:
        by_replica[t.replica] = by_replica.get(t.replica, 0) + 1
    reasons: dict[str, int] = {}
    for t in ok:
        reason = dict(kv.split("=", 1) for kv in t.route.split("; ") if "=" in kv).get("reason")
        reasons[reason or "?"] = reasons.get(reason or "?", 0) + 1
    later = [t for t in ok if t.turn > 0]
    gaps = [
        float(r["load"]) - float(r["runner_up_load"])
        for r in (dict(kv.split("=", 1) for kv in t.route.split("; ") if "=" in kv) for t in ok)
        if r.get("runner_up")
    ]
    return {
        "requests": len(turns),
        "served": len(ok),
        "hit_rate": round(sum(t.cached_tokens for t in ok) / prompt, 4) if prompt else None,
        "hit_rate_later_turns": round(
            sum(t.cached_tokens for t in later) / max(1, sum(t.prompt_tokens for t in later)), 4
        )
        if later
        else None,
        "ttft_p50_ms": _pct(ttfts, 0.5),
        "ttft_p99_ms": _pct(ttfts, 0.99),
        "ttft_mean_ms": round(1000 * statistics.fmean(ttfts), 1) if ttfts else None,
        "requests_by_replica": sorted(by_replica.values(), reverse=True),
        "max_queue_gap": max_queue_gap(ok),
        # The chosen replica's load score less the runner-up's, at each decision (our router's
        # x-route header): how far above the other a replica was when it still got a request.
        "max_load_gap_at_choice": max(gaps) if gaps else None,
        "reasons": reasons,
    }


def _setup_note(doc: dict[str, Any]) -> str:
    w, routers = doc["workload"], doc["routers"]
    if "kv_cache_tokens" not in w:  # results from before the KV cache was sized per replica
        return (
            "The two replicas' engines shared the host's cores (vLLM pins every engine's worker "
            "to the same core): a router that sends every request to one replica got that "
            "core to itself, so TTFT compared fairly only between routers that spread load."
        )
    cores = w.get("replica_cores")
    where = (
        f"on cores of their own ({cores})"
        if cores
        else "on the same core, as vLLM binds every engine of a small host, so every router "
        "has the same compute"
    )
    ideal = routers.get("one-replica", {}).get("kv_cache_tokens_per_replica")
    return (
        f"Each replica's KV cache holds {w['kv_cache_tokens']} tokens: the conversations fit in "
        "the pair's caches, not in one. The engines compute "
        f"{where}. The ideal hit rate is one replica with a cache of {ideal} tokens, the pair's: "
        "every turn finds its history there."
    )


def command(workload: dict[str, Any]) -> str:
    """The command that runs this workload, every flag spelled out (defaults move; a result
    file must say what it measured)."""
    flags = []
    for key, value in workload.items():
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        flags.append(f"--{key.replace('_', '-')} " + " ".join(str(v) for v in values))
    return " ".join(["python -m bench.prefix_routing", *flags])


def markdown(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    lines = [
        "# Prefix-aware routing (bench/prefix_routing.py)",
        "",
        f"Commit {doc['commit']}, {doc['date']}, {doc['machine']}. Default model, "
        f"{doc['routers']['prefix-aware']['replicas']} replicas; `{command(w)}`.",
        "",
        f"Chat: {w['sessions']} sessions at once, {w['turns']} turns each, a shared system prompt "
        f"of {w['system_words']} words (~{w['system_words'] * 13 // 10} tokens), "
        f"{w['user_words']} words per user turn, {w['max_tokens']} tokens per answer. Hit rate: "
        "prompt tokens the engine found in its prefix cache (`usage.prompt_tokens_details`). "
        "Queue gap: the largest difference in in-flight requests between the two replicas as the "
        "client saw them (sent, not finished: the Router's queue included). Load gap: the chosen "
        "replica's load score less the runner-up's at each decision, at most (x-route; our "
        "router only).",
        "",
        _setup_note(doc),
        "",
        "| router | hit rate | of ideal | later turns | TTFT p50 ms | TTFT p99 ms | requests "
        "per replica | queue gap | load gap | decisions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ideal = (doc["routers"].get("one-replica", {}).get("chat") or {}).get("hit_rate")
    for name, r in doc["routers"].items():
        c = r.get("chat")
        if not c:
            lines.append(f"| {name} | failed: {r.get('error')} ||||||||")
            continue
        of_ideal = f"{c['hit_rate'] / ideal:.0%}" if ideal and c["hit_rate"] is not None else "-"
        lines.append(
            f"| {name} | {c['hit_rate']:.1%} | {of_ideal} | {c['hit_rate_later_turns']:.1%} | "
            f"{c['ttft_p50_ms']} | {c['ttft_p99_ms']} | {c['requests_by_replica']} | "
            f"{c['max_queue_gap']} | {c['max_load_gap_at_choice']} | {c['reasons']} |"
        )
    lines += [
        "",
        f"Hot prefix: {w['hot_requests']} requests, {w['hot_concurrency']} at once, all sharing "
        f"a {w['hot_words']}-word system prompt.",
        "",
        "| router | hit rate | TTFT p50 ms | TTFT p99 ms | requests per replica | queue gap | "
        "load gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["routers"].items():
        h = r.get("hot")
        if h:
            lines.append(
                f"| {name} | {h['hit_rate']:.1%} | {h['ttft_p50_ms']} | {h['ttft_p99_ms']} | "
                f"{h['requests_by_replica']} | {h['max_queue_gap']} | "
                f"{h['max_load_gap_at_choice']} |"
            )
    return "\n".join(lines) + "\n"
