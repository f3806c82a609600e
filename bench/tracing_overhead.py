"""Cost of tracing: the same load through two identical apps, one exporting spans, one not.

Both apps run side by side in one Ray instance over the simulated engine (so that the serving
path, not the model, dominates), and the load alternates between them round by round to cancel
out drift on a noisy machine. Prints requests/s and client-side TTFT p50 for each and their
ratio. Metrics and the access log are on in both: only span export differs.

    .venv/bin/python -m bench.tracing_overhead [--rounds 3 --round-s 10 --concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.client import send
from bench.private_ray import private_ray

ROOT = Path(__file__).resolve().parents[1]


def app_args(exporter: str, spans_path: str) -> dict:
    return {
        "tracing": {"exporter": exporter, "file_path": spans_path},
        "models": [
            {
                "name": "sim",
                "source": "simulated",
                "simulation": {"step_s": 0.005},
                "engine": {"max_num_seqs": 64},
                "deployment": {"max_ongoing_requests": 64, "num_cpus": 0.25},
            }
        ],
    }


async def closed_loop(url: str, concurrency: int, secs: float) -> tuple[int, list[float]]:
    stop = time.monotonic() + secs
    ttfts: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:

        async def client(k: int):
            body = {"model": "sim", "prompt": "x", "max_tokens": 16, "stream": True}
            while time.monotonic() < stop:
                r = await send(c, "/v1/completions", body, record_errors=False)
                ttfts.append(r.first_chunk_s)

        await asyncio.gather(*(client(k) for k in range(concurrency)))
    return len(ttfts), ttfts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--round-s", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--port", type=int, default=18600)
    args = p.parse_args()

    spans = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
    totals = {"untraced": [0, 0.0, []], "traced": [0, 0.0, []]}
    with private_ray(args.port, num_cpus=8) as ray_app:
        ray_app.deploy(app_args("none", spans), name="untraced", route_prefix="/untraced")
        ray_app.deploy(app_args("file", spans), name="traced", route_prefix="/traced")
        for name in totals:  # warm-up
            asyncio.run(closed_loop(f"{ray_app.url}/{name}", args.concurrency, 2))
        for _ in range(args.rounds):
            for name in totals:
                n, ttfts = asyncio.run(
                    closed_loop(f"{ray_app.url}/{name}", args.concurrency, args.round_s)
                )
                totals[name][0] += n
                totals[name][1] += args.round_s
                totals[name][2] += ttfts
    rows = {
        name: {"requests_per_s": n / secs, "ttft_p50_ms": statistics.median(t) * 1000}
        for name, (n, secs, t) in totals.items()
    }
    num_spans = sum(1 for _ in open(spans))
    ratio_rps = rows["traced"]["requests_per_s"] / rows["untraced"]["requests_per_s"]
    ratio_ttft = rows["traced"]["ttft_p50_ms"] / rows["untraced"]["ttft_p50_ms"]
    for name, r in rows.items():
        print(f"{name:9s} {r['requests_per_s']:7.1f} req/s  TTFT p50 {r['ttft_p50_ms']:6.1f} ms")
    print(
        f"traced / untraced: throughput x{ratio_rps:.3f}, TTFT p50 x{ratio_ttft:.3f} "
        f"({num_spans} spans exported)"
    )
    out = ROOT / "bench" / "results" / "tracing_overhead.json"
    out.write_text(
        json.dumps(
            {
                "rows": rows,
                "throughput_ratio": ratio_rps,
                "ttft_p50_ratio": ratio_ttft,
                "spans": num_spans,
                "date": time.strftime("%Y-%m-%d"),
                "args": vars(args),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
