"""Admission control under overload: goodput, TTFT and rejections at 1x, 2x and 4x capacity.

Starts Ray and the app from a Serve config (the default model on the real vLLM engine unless
`--sim`), adds an unlimited `bench` tenant so that the per-model queue, not a tenant's rate limit,
is what sheds the load, then:
1. measures capacity: requests/s completed by a closed loop of `max_ongoing_requests` clients;
2. offers open-loop Poisson load at each multiple of that rate for `--duration-s` seconds;
3. prints, per load level, goodput (requests/s whose TTFT met `--ttft-target-s`), p50/p99 TTFT of
   admitted requests, and the share rejected (429/503) at admission.

    .venv/bin/python -m bench.admission_load            # real engine, ~3 minutes
    .venv/bin/python -m bench.admission_load --sim      # simulated engine, policy only

Writes bench/results/admission_load.json. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench.client import send
from bench.private_ray import private_ray

ROOT = Path(__file__).resolve().parents[1]
BENCH_KEY = "sk-bench-unlimited-0001"


@dataclass
class Result:
    status: int
    ttft_s: float | None
    latency_s: float


def app_args(config_path: Path, sim: bool, max_queue_wait_s: float) -> tuple[dict, str, int]:
    doc = yaml.safe_load(config_path.read_text())
    args = doc["applications"][0]["args"]
    # An operator bounds the queue wait by the TTFT they promise: waiting longer is no goodput.
    args.setdefault("admission", {})["max_queue_wait_s"] = max_queue_wait_s
    model = args["models"][0]
    args["models"] = [model]
    if sim:
        model["source"] = "simulated"
    args.setdefault("tenants", []).append(
        {
            "name": "bench",
            "api_keys": [BENCH_KEY],
            "priority": "standard",
            "max_timeout_s": 600,
            "default_timeout_s": 120,
        }
    )
    return args, model["name"], model.get("deployment", {}).get("max_ongoing_requests", 64)


async def one(client: httpx.AsyncClient, model: str, max_tokens: int, i: int) -> Result:
    body = {
        "model": model,
        "prompt": f"Request {i}: tell a story.",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    r = await send(
        client, "/v1/completions", body, headers={"Authorization": f"Bearer {BENCH_KEY}"}
    )
    return Result(r.status, r.first_chunk_s if r.status == 200 else None, r.latency_s)


async def capacity_rps(client, model: str, concurrency: int, max_tokens: int, secs: float):
    stop = time.monotonic() + secs
    done = 0

    async def loop(k: int):
        nonlocal done
        i = 0
        while time.monotonic() < stop:
            if (await one(client, model, max_tokens, k * 10_000 + i)).status == 200:
                done += 1
            i += 1

    t0 = time.monotonic()
    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return done / (time.monotonic() - t0)


async def open_loop(client, model: str, rate: float, secs: float, max_tokens: int, seed: int):
    rng = random.Random(seed)
    tasks, t = [], 0.0
    t0 = time.monotonic()
    i = 0
    while t < secs:
        t += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
        tasks.append(asyncio.create_task(one(client, model, max_tokens, i)))
        i += 1
    return await asyncio.gather(*tasks)


def summarize(multiple: float, rate: float, results: list[Result], secs: float, target: float):
    ok = [r for r in results if r.status == 200 and r.ttft_s is not None]
    ttfts = sorted(r.ttft_s for r in ok)
    rejected = [r for r in results if r.status in (429, 503)]
    errors = [r for r in results if r.status not in (200, 429, 503)]
    pct = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else None  # noqa
    return {
        "load_x_capacity": multiple,
        "offered_rps": round(rate, 2),
        "requests": len(results),
        "goodput_rps": round(sum(1 for x in ttfts if x <= target) / secs, 2),
        "ttft_p50_s": pct(0.5),
        "ttft_p99_s": pct(0.99),
        "rejected_share": round(len(rejected) / len(results), 3) if results else 0,
        "reject_latency_p50_s": statistics.median(r.latency_s for r in rejected)
        if rejected
        else None,
        "other_errors": len(errors),
    }


async def run(args) -> dict:
    app_config, model, concurrency = app_args(args.config, args.sim, args.max_queue_wait_s)
    limits = httpx.Limits(max_connections=2000)
    with private_ray(args.port, num_cpus=8) as ray_app:
        ray_app.deploy(app_config, name="bench")
        async with httpx.AsyncClient(base_url=ray_app.url, timeout=300, limits=limits) as client:
            await capacity_rps(client, model, 4, args.max_tokens, 5)  # warm-up
            cap = await capacity_rps(client, model, concurrency, args.max_tokens, args.duration_s)
            print(
                f"capacity: {cap:.2f} requests/s at {concurrency} concurrent "
                f"({args.max_tokens} tokens each)"
            )
            rows = []
            for k, multiple in enumerate(args.loads):
                results = await open_loop(
                    client, model, cap * multiple, args.duration_s, args.max_tokens, seed=k
                )
                rows.append(
                    summarize(
                        multiple, cap * multiple, results, args.duration_s, args.ttft_target_s
                    )
                )
                print(rows[-1])
                await asyncio.sleep(5)  # let the queue drain between levels
    return {"capacity_rps": cap, "concurrency": concurrency, "rows": rows}


def table(rows: list[dict], target: float) -> str:
    head = (
        f"| load | offered req/s | goodput req/s (TTFT <= {target:g} s) | TTFT p50 | "
        "TTFT p99 | rejected | rejection answered in (p50) |\n|---|---|---|---|---|---|---|"
    )
    fmt = lambda v: "-" if v is None else f"{v:.2f} s"  # noqa
    lines = [
        f"| {r['load_x_capacity']:g}x | {r['offered_rps']} | {r['goodput_rps']} | "
        f"{fmt(r['ttft_p50_s'])} | {fmt(r['ttft_p99_s'])} | {r['rejected_share']:.0%} | "
        f"{fmt(r['reject_latency_p50_s'])} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    p.add_argument("--sim", action="store_true", help="simulated engine instead of vLLM")
    p.add_argument("--port", type=int, default=18500)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ttft-target-s", type=float, default=2.0)
    p.add_argument(
        "--max-queue-wait-s",
        type=float,
        default=1.5,
        help="admission.max_queue_wait_s for the run (below the TTFT target)",
    )
    p.add_argument("--loads", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    args = p.parse_args()
    out = asyncio.run(run(args))
    out.update(
        machine=platform.platform(),
        processor=platform.processor(),
        sim=args.sim,
        date=time.strftime("%Y-%m-%d"),
        max_tokens=args.max_tokens,
        max_queue_wait_s=args.max_queue_wait_s,
        ttft_target_s=args.ttft_target_s,
    )
    path = (
        ROOT
        / "bench"
        / "results"
        / ("admission_load_sim.json" if args.sim else "admission_load.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print()
    print(table(out["rows"], args.ttft_target_s))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
