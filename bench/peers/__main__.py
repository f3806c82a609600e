"""`python -m bench.peers --full|--smoke [--systems ...]`: start each system in turn, measure it,
stop it, and write the report. See bench/peers/__init__.py and docs/benchmarks.md.

Systems run one at a time, in the order llmserve, ray-serve-llm, vllm: the open-loop loads are
multiples of llmserve's capacity, so it is measured first. `--rounds N` adds N - 1 rounds of the
sweep at 1, 16 and 64 streams, the order reversed in every other round, and reports the median of
each round's ratio, of tokens/s at 16 and 64 streams and of TTFT at one (bench/peers/rounds.py).
Exit status 1 when a system failed to start, to be measured or to stop cleanly (the report is
written anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from bench.peers import machine, report, rounds, scenarios, systems
from bench.peers.spec import (
    BASELINE,
    FULL,
    ROOT,
    SMOKE,
    SYSTEMS,
    Model,
    Workload,
    resolve_model,
    with_overrides,
)

START_ATTEMPTS = 2
CAPACITY_DEFINITION = (
    "the highest request throughput of {ref} in the concurrency sweep (closed loop, same "
    "request shape), i.e. where its throughput saturates."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Benchmark llmserve against Ray Serve LLM and bare vLLM on this machine.",
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--full", action="store_true", help="the full workload (`make bench`)")
    mode.add_argument("--smoke", action="store_true", help="a few requests per stage (CI)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument(
        "--config",
        type=Path,
        default=ROOT / "serve_config.yaml",
        help="Serve config whose default model and engine args all systems use",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="default: bench/results (--full), /tmp/llmserve-peers-smoke (--smoke)",
    )
    p.add_argument("--model-dir", type=Path, help="another local HF model folder (smoke test)")
    p.add_argument("--model-name", help="the name to serve --model-dir under")
    p.add_argument("--max-model-len", type=int, help="override the config's max_model_len")
    p.add_argument(
        "--port-base",
        type=int,
        default=18510,
        help="system i listens on port-base + i (each its own port)",
    )
    p.add_argument(
        "--ready-timeout-s",
        type=float,
        default=900,
        help="per start attempt; Ray Serve LLM took 7-10 min on this 2-core machine "
        "under heavy load from other work",
    )
    # Narrower runs, for development; the full run takes the presets in spec.py.
    p.add_argument("--concurrency", type=int, nargs="+", help="sweep levels")
    p.add_argument("--loads", type=float, nargs="+", help="open-loop multiples of capacity")
    p.add_argument("--window-s", type=float, help="open-loop arrival window per level")
    p.add_argument("--mixed-window-s", type=float)
    p.add_argument("--capacity-rps", type=float, help="skip deriving capacity from the sweep")
    p.add_argument(
        "--waves",
        type=int,
        help="sweep requests per level, in multiples of its concurrency (default 2): more "
        "waves, a longer window per level and less of it in ramp-up",
    )
    p.add_argument(
        "--scenarios",
        nargs="+",
        choices=["sweep", "open_loop", "mixed"],
        default=["sweep", "open_loop", "mixed"],
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds in all: each after the first starts every system again for a sweep at "
        f"{', '.join(map(str, (rounds.TTFT_LEVEL, *rounds.LEVELS)))} streams, in the other "
        "order; the report gives the median of the rounds' ratios (tokens/s, one stream's TTFT)",
    )
    return p.parse_args(argv)


def workload(args: argparse.Namespace) -> Workload:
    return with_overrides(
        SMOKE if args.smoke else FULL,
        concurrencies=tuple(args.concurrency) if args.concurrency else None,
        loads_x_capacity=tuple(args.loads) if args.loads else None,
        open_loop_window_s=args.window_s,
        mixed_window_s=args.mixed_window_s,
        prompts_per_concurrency=args.waves,
    )


async def measure(
    system: systems.System,
    model: Model,
    w: Workload,
    scenario_names: list[str],
    capacity: dict[str, Any],
    entry: dict[str, Any],
    log: Path,
) -> None:
    """Runs the scenarios against a ready system, filling `entry` as it goes (so a failure
    halfway keeps what was measured)."""
    url = system.base_url
    await scenarios.warm_up(url, model, w, log)
    if w.idle_window_s > 0:
        entry["idle_cpu_pct"] = await scenarios.idle_cpu(system.cpu_by_role, w.idle_window_s)
        print(
            f"  idle: {entry['idle_cpu_pct']['all_but_engine']}% of a core beside the engine",
            flush=True,
        )
    if "sweep" in scenario_names:
        entry["sweep"] = await scenarios.sweep(url, model, w, log, system.cpu_by_role)
        system.track()
        if capacity.get("rps") is None:
            capacity.update(
                rps=scenarios.capacity_rps(entry["sweep"]),
                reference=system.name,
                definition=CAPACITY_DEFINITION.format(ref=system.name),
            )
    if capacity.get("rps") is None and {"open_loop", "mixed"} & set(scenario_names):
        raise RuntimeError("no capacity: run the sweep first or give --capacity-rps")
    if "open_loop" in scenario_names:
        entry["open_loop"] = await scenarios.open_loop(url, model, w, capacity["rps"], log)
        system.track()
    if "mixed" in scenario_names:
        entry["mixed"] = await scenarios.mixed(
            url, model, w, capacity["rps"], model.engine_args["max_num_seqs"]
        )


def start(system: systems.System, timeout_s: float) -> tuple[float, int]:
    """Starts the system and waits until it answers; (seconds to ready, attempts). A system that
    exits while starting gets one more try: on a machine this busy, Ray's own start-up has a
    timeout ("The current node timed out during startup") that load alone can trip."""
    for attempt in range(1, START_ATTEMPTS + 1):
        system.start()
        try:
            return round(system.wait_ready(timeout_s), 1), attempt
        except systems.SystemExited as e:
            if attempt == START_ATTEMPTS:
                raise
            print(f"  exited while starting, trying again: {str(e).splitlines()[0]}", flush=True)
            system.stop()
    raise AssertionError("unreachable")


def run_system(
    name: str,
    port: int,
    model: Model,
    w: Workload,
    args,
    capacity: dict[str, Any],
    work_dir: Path,
    scenario_names: list[str],
) -> dict[str, Any]:
    system = systems.make(name, model, port, work_dir, args.config)
    entry: dict[str, Any] = {"port": port, "error": None}
    print(f"== {name} on port {port} (log {system.log_path})", flush=True)
    try:
        entry["ready_s"], entry["start_attempts"] = start(system, args.ready_timeout_s)
        print(f"  ready after {entry['ready_s']} s", flush=True)
        asyncio.run(
            measure(
                system, model, w, scenario_names, capacity, entry, work_dir / f"{name}.client.log"
            )
        )
    except BaseException as e:  # noqa: BLE001 - a failed system must still be stopped and reported
        entry["error"] = f"{type(e).__name__}: {e}"
        print(f"  FAILED: {entry['error']}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if isinstance(e, KeyboardInterrupt):
            raise
    finally:
        stop = system.stop()
        entry["stop"] = systems.stop_report_dict(stop)
        entry["processes"] = system.processes()
        print(
            f"  stopped in {stop.stop_s} s: clean={stop.clean} killed={stop.killed} "
            f"leftover={stop.leftover} port_free={stop.port_free}",
            flush=True,
        )
    return entry


def run_rounds(args, model: Model, w: Workload, order, capacity, work_dir: Path, results) -> None:
    """Rounds 2..N: every system again, a sweep at one stream and rounds.LEVELS, the order
    alternating; the entries go to results["rounds"] and the medians to
    results["across_rounds"]."""
    compared = (rounds.TTFT_LEVEL, *rounds.LEVELS)
    levels = tuple(c for c in w.concurrencies if c in compared) or w.concurrencies
    w_round = with_overrides(w, concurrencies=levels, idle_window_s=0.0)  # round 1 has it
    results["rounds"] = []
    for number in range(2, args.rounds + 1):
        entries: dict[str, Any] = {}
        results["rounds"].append({"round": number, "order": [], "systems": entries})
        for name in rounds.order(number, order):
            print(f"-- round {number} of {args.rounds}", flush=True)
            results["rounds"][-1]["order"].append(name)
            entries[name] = run_system(
                name,
                args.port_base + SYSTEMS.index(name),
                model,
                w_round,
                args,
                capacity,
                work_dir / f"round{number}",
                ["sweep"],
            )
        # After every round, so that a run cut short still reports the rounds it finished.
        sweeps = [{n: e.get("sweep") for n, e in results["systems"].items()}]
        sweeps += [{n: e.get("sweep") for n, e in r["systems"].items()} for r in results["rounds"]]
        results["across_rounds"] = rounds.summarize(
            sweeps, BASELINE, tuple(c for c in levels if c in rounds.LEVELS) or levels
        )


def _terminate(signum, frame) -> None:
    # SIGTERM as Ctrl-C: the running system is still stopped and the report still written.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    t0 = time.monotonic()
    w = workload(args)
    out_dir = args.out_dir or (
        Path("/tmp/llmserve-peers-smoke") if args.smoke else ROOT / "bench" / "results"
    )
    now = dt.datetime.now()
    stamp = now.strftime("%Y-%m-%d-%H%M%S")
    work_dir = out_dir / "peers-logs" / stamp
    model = resolve_model(args.config, args.model_dir, args.model_name, args.max_model_len)
    # llmserve first: its capacity sets the open-loop loads of every system.
    order = sorted(args.systems, key=SYSTEMS.index)
    capacity: dict[str, Any] = {
        "rps": args.capacity_rps,
        "reference": None,
        "definition": "given on the command line (--capacity-rps).",
    }
    results: dict[str, Any] = {
        "schema": 1,
        "mode": "smoke" if args.smoke else "full",
        "date": now.isoformat(timespec="seconds"),
        "machine": machine.machine_info(),
        "versions": machine.versions(),
        "load_average_start": machine.load_average(),
        "model": {
            "name": model.name,
            "path": str(model.path),
            "engine_args": model.engine_args,
            "kv_cache_space_gib": model.kv_cache_space_gib,
        },
        "workload": w.to_dict(),
        "scenarios": args.scenarios,
        "capacity": capacity,
        "logs": str(work_dir),
        "systems": {},
    }
    print(
        f"peers benchmark ({results['mode']}): {', '.join(order)}; model {model.name}; "
        f"logs in {work_dir}",
        flush=True,
    )
    # The client (vllm.benchmarks.serve) takes many seconds to import: do it while the first
    # system starts rather than after.
    threading.Thread(
        target=importlib.import_module, args=("vllm.benchmarks.serve",), daemon=True
    ).start()
    try:
        for name in order:
            results["systems"][name] = run_system(
                name,
                args.port_base + SYSTEMS.index(name),
                model,
                w,
                args,
                capacity,
                work_dir,
                args.scenarios,
            )
        if args.rounds > 1 and "sweep" in args.scenarios:
            run_rounds(args, model, w, order, capacity, work_dir, results)
    finally:
        results["load_average_end"] = machine.load_average()
        results["wall_s"] = round(time.monotonic() - t0, 1)
        paths = report.write(results, out_dir)
        if out_dir.resolve() == (ROOT / "bench" / "results").resolve() and not args.smoke:
            from bench import summary

            summary.update_readme()  # the README's figures, from these results
        print(f"\nwritten: {', '.join(str(p) for p in paths.values())}")
        print(f"total {results['wall_s'] / 60:.1f} min")
    entries = [results["systems"], *(r["systems"] for r in results.get("rounds", []))]
    failed = [n for es in entries for n, e in es.items() if e["error"] or not e["stop"]["clean"]]
    if failed:
        print(f"FAILED or not stopped cleanly: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
