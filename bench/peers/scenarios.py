"""The three scenarios, each a coroutine that drives one running system and returns plain dicts.

(a) `sweep`: closed loop at each concurrency (1, 4, 16, 64): request and output-token throughput,
    TTFT and TPOT p50/p99, from `vllm.benchmarks.serve`; CPU ms per output token by role.
(b) `open_loop`: Poisson arrivals at multiples of a capacity (requests/s; see `capacity_rps`):
    goodput, TTFT p99 of completed requests, and the shares refused (429/503) or failed.
(c) `mixed`: batch traffic saturating the system while interactive requests arrive; TTFT per
    class. This platform sees each class's tenant key (priority interactive or batch); the peers
    get the same requests and headers, which they ignore: the same mix, unclassed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.cpu import ms_per_token, share_of_core
from bench.peers.load import Req, bench_args, client_session, run_bench, samples, stream_request
from bench.peers.spec import TENANTS, Model, Workload

REFUSED = (429, 503)
DRAIN_TIMEOUT_S = 300.0


def pct_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def latency_summary(reqs: list[Req]) -> dict[str, Any]:
    ok = [r for r in reqs if r.ok]
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    return {
        "ttft_p50_ms": pct_ms(ttft, 50),
        "ttft_p99_ms": pct_ms(ttft, 99),
        "tpot_p50_ms": pct_ms(tpot, 50),
        "tpot_p99_ms": pct_ms(tpot, 99),
    }


def outcome_counts(reqs: list[Req]) -> dict[str, Any]:
    statuses = Counter(r.status for r in reqs)
    n = max(1, len(reqs))
    refused = sum(statuses[s] for s in REFUSED)
    failed = len(reqs) - statuses[200] - refused
    # A refusal is a promise too: the client learns at once that it must come back later.
    refusal_s = [r.latency_s for r in reqs if r.status in REFUSED and r.latency_s is not None]
    return {
        "requests": len(reqs),
        "completed": statuses[200],
        "refused_share": round(refused / n, 4),
        "refusal_p99_ms": pct_ms(refusal_s, 99),
        "error_share": round(failed / n, 4),
        "status_counts": {str(k): v for k, v in sorted(statuses.items())},
    }


async def warm_up(base_url: str, model: Model, w: Workload, log: Path) -> None:
    """Requests whose figures are thrown away: the first ones pay one-off costs."""
    if w.num_warmups:
        await run_bench(
            bench_args(
                base_url,
                model,
                w,
                num_prompts=w.num_warmups,
                max_concurrency=4,
                seed=w.seed + 999,
                api_key=TENANTS.standard,
            ),
            log,
        )


async def idle_cpu(cpu: Callable[[], dict[str, float]], window_s: float) -> dict[str, float]:
    """% of a core by role while no request is in flight, over `window_s` (bench/peers/cpu.py)."""
    before, start = cpu(), time.monotonic()
    await asyncio.sleep(window_s)
    return share_of_core(before, cpu(), time.monotonic() - start)


async def sweep(
    base_url: str,
    model: Model,
    w: Workload,
    log: Path,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """`cpu`: the system's CPU seconds by role so far (bench/peers/cpu.py), read around each
    level for its CPU ms per output token."""
    rows = []
    for c in w.concurrencies:
        cpu_before = cpu() if cpu else None
        args = bench_args(
            base_url,
            model,
            w,
            num_prompts=w.prompts_at(c),
            max_concurrency=c,
            api_key=TENANTS.sweep,
        )
        agg, reqs = await run_bench(args, log)
        per_token = {}
        if cpu_before is not None:
            per_token = ms_per_token(cpu_before, cpu(), agg["total_output_tokens"])
        rows.append(
            {
                "concurrency": c,
                "cpu_ms_per_token": per_token,
                **outcome_counts(reqs),
                "duration_s": round(agg["duration"], 2),
                "request_throughput": round(agg["request_throughput"], 3),
                "output_throughput": round(agg["output_throughput"], 1),
                # vLLM's own percentiles (numpy, linear), over the completed requests
                **{
                    f"{m}_{q}_ms": round(agg[f"{q}_{m}_ms"], 1)
                    for m in ("ttft", "tpot")
                    for q in ("p50", "p99")
                },
                # Inter-token latency: the gap a reader sees between one piece of text and the
                # next (a lump of several tokens is one piece and gaps of 0 within it).
                **{f"itl_{q}_ms": round(agg[f"{q}_itl_ms"], 1) for q in ("p50", "p90", "p99")},
            }
        )
        print(
            f"    sweep c={c}: {rows[-1]['request_throughput']} req/s, "
            f"{rows[-1]['output_throughput']} tok/s, TTFT p50 {rows[-1]['ttft_p50_ms']} ms, "
            f"failed {rows[-1]['requests'] - rows[-1]['completed']}",
            flush=True,
        )
    return rows


def capacity_rps(sweep_rows: list[dict[str, Any]]) -> float:
    """Capacity: the highest request throughput the sweep reached (closed loop, all requests
    of the same shape). Throughput saturates as concurrency grows, so on this machine that is
    the plateau at the top of the sweep; taking the max keeps a noisy top level from lowering it."""
    return max(r["request_throughput"] for r in sweep_rows)


async def open_loop(
    base_url: str, model: Model, w: Workload, capacity: float, log: Path
) -> list[dict[str, Any]]:
    rows = []
    for k, multiple in enumerate(w.loads_x_capacity):
        rate = multiple * capacity
        n = max(4, round(rate * w.open_loop_window_s))
        n = min(n, w.max_open_loop_requests or n)
        args = bench_args(
            base_url,
            model,
            w,
            num_prompts=n,
            request_rate=rate,
            seed=w.seed + 100 + k,
            api_key=TENANTS.standard,
        )
        agg, reqs = await run_bench(args, log)
        good = sum(
            1
            for r in reqs
            if r.ok
            and r.ttft_s * 1000 <= w.ttft_slo_ms
            and (r.tpot_s is None or r.tpot_s * 1000 <= w.tpot_slo_ms)
        )
        rows.append(
            {
                "load_x_capacity": multiple,
                "offered_rps": round(rate, 3),
                **outcome_counts(reqs),
                "duration_s": round(agg["duration"], 2),
                # vLLM's goodput: requests meeting both targets / (first send .. last completion)
                "goodput_rps": round(agg["request_goodput"], 3),
                "good_share": round(good / len(reqs), 4),
                **latency_summary(reqs),
            }
        )
        r = rows[-1]
        print(
            f"    open loop {multiple:g}x ({rate:.2f} req/s): goodput {r['goodput_rps']} req/s, "
            f"TTFT p99 {r['ttft_p99_ms']} ms, refused {r['refused_share']:.0%}, "
            f"errors {r['error_share']:.0%}",
            flush=True,
        )
    return rows


async def mixed(
    base_url: str, model: Model, w: Workload, capacity: float, max_num_seqs: int
) -> dict[str, Any]:
    """Batch: a closed loop of 1.5x the engine's max_num_seqs clients (so requests wait for a
    slot), started first and kept running; once its first wave is through, interactive
    requests arrive (Poisson, a quarter of the capacity) over `mixed_window_s`. Only batch
    requests sent while interactive ones were being sent or served are counted, so both
    classes are measured under the same saturation."""
    num_batch = max(1, math.ceil(w.mixed_batch_concurrency_x_seqs * max_num_seqs))
    rate = w.mixed_interactive_x_capacity * capacity
    rng = random.Random(w.seed)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > w.mixed_window_s:
            break
        arrivals.append(t)
    arrivals = arrivals or [w.mixed_window_s / 2]
    batch_prompts = samples(model, w, 4 * num_batch, w.output_len, seed=w.seed + 7)
    inter_prompts = samples(
        model, w, len(arrivals), w.mixed_interactive_output_len, seed=w.seed + 8
    )
    batch: list[Req] = []
    stop = asyncio.Event()
    # Steady state first: the batch clients all start at once, so wait until the first wave
    # (the max_num_seqs requests the engine took) has finished and the queued ones moved in.
    settled = asyncio.Event()

    async with client_session() as session:

        async def batch_client(k: int) -> None:
            i = k
            while not stop.is_set():
                prompt = batch_prompts[i % len(batch_prompts)]
                r = await stream_request(session, base_url, model, prompt, TENANTS.batch)
                batch.append(r)
                if sum(1 for b in batch if b.ok) >= max_num_seqs:
                    settled.set()
                i += num_batch
                if r.status in REFUSED:
                    await asyncio.sleep(0.5)  # a refused client backs off instead of spinning

        async def interactive(at_s: float, sample) -> Req:
            await asyncio.sleep(max(0.0, t0 + at_s - time.perf_counter()))
            return await stream_request(session, base_url, model, sample, TENANTS.interactive)

        workers = [asyncio.create_task(batch_client(k)) for k in range(num_batch)]
        t_start = time.perf_counter()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(settled.wait(), timeout=w.mixed_settle_max_s)
        t0 = time.perf_counter()
        inter = await asyncio.gather(*(interactive(a, s) for a, s in zip(arrivals, inter_prompts)))
        t_end = time.perf_counter()
        stop.set()  # no new batch requests; those in flight finish, so none is cut short
        _, late = await asyncio.wait(workers, timeout=DRAIN_TIMEOUT_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    in_window = [r for r in batch if t0 <= r.start_s <= t_end]
    window_s = t_end - t0
    out = {
        "batch_clients": num_batch,
        "interactive_rps": round(rate, 3),
        "settle_s": round(t0 - t_start, 1),
        "window_s": round(window_s, 1),
        "interactive": {**outcome_counts(inter), **latency_summary(inter)},
        "batch": {
            **outcome_counts(in_window),
            **latency_summary(in_window),
            "output_throughput": round(
                sum(r.output_tokens for r in in_window if r.ok) / window_s, 1
            ),
        },
    }
    i, b = out["interactive"], out["batch"]
    print(
        f"    mixed: interactive TTFT p50 {i['ttft_p50_ms']} ms (n={i['completed']}), "
        f"batch TTFT p50 {b['ttft_p50_ms']} ms (n={b['completed']})",
        flush=True,
    )
    return out
