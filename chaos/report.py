"""chaos.md: the figures of a `make chaos` run as Markdown tables, one per scenario."""

from __future__ import annotations


def _s(v) -> str:
    return "-" if v is None else f"{v:g} s" if isinstance(v, (int, float)) else str(v)


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def replica_death(r: dict) -> str:
    rows = [
        [
            f["fault"],
            f"{f['replicas']} x {f['deployment']}",
            f["clients"],
            f["sent"],
            f["ok"],
            f"{f['failed']} ({f['failed_in_flight_at_fault']} of {f['in_flight_at_fault']} "
            "in flight)",
            _kinds(f["failed_by_outcome"]),
            f["unclean_failures"],
            f["hangs"],
            _s(f["serve_noticed_s"]),
            _s(f["capacity_back_s"]),
            f"{f['ok_per_s_before']} / {f['ok_per_s_until_back']} / {f['ok_per_s_after']}",
        ]
        for f in r["faults"].values()
    ]
    return _table(
        [
            "fault",
            "deployment",
            "clients",
            "sent",
            "ok",
            "failed (in flight at the kill)",
            "failures",
            "unclean",
            "hangs",
            "Serve noticed",
            "capacity back",
            "ok/s before / until back / after",
        ],
        rows,
    )


def node_loss(r: dict) -> str:
    row = [
        r["clients"],
        r["sent"],
        r["ok"],
        f"{r['failed']} ({r['failed_in_flight_at_fault']} of {r['in_flight_at_fault']} in flight)",
        _kinds(r["failed_by_outcome"]),
        r["hangs"],
        _s(r["node_declared_dead_s"]),
        _s(r["serve_noticed_s"]),
        f"{r['ok_per_s_before']} / {r['ok_per_s_survivor_only']} / {r['ok_per_s_after_back']}",
        _s(r["replica_back_after_node_added_s"]),
    ]
    return _table(
        [
            "clients",
            "sent",
            "ok",
            "failed (in flight at the loss)",
            "failures",
            "hangs",
            "node declared dead",
            "Serve noticed",
            "ok/s two nodes / survivor only / node back",
            "replica back after node added",
        ],
        [row],
    )


def drain(r: dict) -> str:
    rows = [
        [
            name,
            c["in_flight_at_change"],
            c["in_flight_on_old_replicas_at_change"],
            c["finished_on_old_replicas_after_change"],
            c["sent"],
            c["failed"],
            c["hangs"],
            _s(c["last_finish_on_old_after_change_s"]),
            _s(c["serve_run_returned_s"]),
            _s(c["old_replicas_gone_s"]),
            c["router_running_min"],
            c["model_running_min"],
            _s(c["max_latency_s"]),
        ]
        for name, c in r["changes"].items()
    ]
    return _table(
        [
            "change",
            "in flight at the change",
            "of them on old replicas",
            "finished on old replicas after it",
            "sent",
            "failed",
            "hangs",
            "last old-replica finish",
            "serve.run returned",
            "old replicas gone",
            "fewest Routers running",
            "fewest model replicas running",
            "slowest request",
        ],
        rows,
    )


def soak(r: dict) -> str:
    rows = [
        [
            role,
            m["start"],
            m["end"],
            f"{m['growth']:+g} ({m['growth_pct']:+g}%)",
            f"{m['trend_mb_per_min']:+g}",
        ]
        for role, m in r["rss_mb"].items()
    ]
    loads = "; ".join(
        f"{model}: {x['sent']} requests, {x['failed']} failed" for model, x in r["load"].items()
    )
    return f"{r['soak_s']} s after {r['warmup_s']} s of warm-up; {loads}\n\n" + _table(
        ["process", "RSS start MB", "RSS end MB", "growth MB", "trend MB/min"], rows
    )


SECTIONS = {
    "replica-death-engine": ("Replica death under load: engine", replica_death),
    "replica-death-actors": ("Replica death under load: actors", replica_death),
    "node-loss": ("Node loss", node_loss),
    "drain": ("Graceful drain on a config change", drain),
    "soak": ("Soak", soak),
}


def markdown(results: list[dict]) -> str:
    parts = ["# Chaos suite results\n"]
    for r in results:
        title, table = SECTIONS[r["scenario"]]
        parts.append(
            f"## {title} ({r['form']} form, {r['started']}, {r['duration_s']:g} s)\n\n"
            f"{table(r)}\n\nProcesses left running afterwards: "
            f"{len(r['leftover_processes'])}\n"
        )
    return "\n".join(parts)
