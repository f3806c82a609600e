"""Adapter-aware routing against routing by load alone, on two replicas of the default model
serving eight LoRA adapters, two per engine step (`max_loras` 2) and by default four in each
engine's memory (`max_cpu_loras` 4: the two engines together can hold all eight, if each holds
its own half), one router after the other in one run, the same Zipf-skewed traffic.

Per router: adapter loads per 1,000 requests (requests sent to an engine that did not hold their
adapter, as its replica last reported it: `x-route` says `adapter_held`), TTFT p50/p99 of the
requests whose engine held their adapter and of those whose engine loaded it first, tokens/s,
and which replicas served the hottest adapter. Then the spread: the coldest adapter, loaded by one
request, then a burst of `SPREAD_REQUESTS` for it, `SPREAD_CONCURRENCY` at once (more than
`adapter_load_margin` above the other replica's load): seconds from the burst's start to the
first token of its first reply from a replica other than the one that loaded it.

Then Ray Serve LLM (bench/adapter_routing_ray.py) under the same requests: the same replicas,
engine args and adapter files, served from a local S3 stand-in (moto's server); its loads come
from Ray's metrics, and its replies do not name their replica (no spread, no TTFT by held).

    .venv/bin/python -m bench.adapter_routing [--requests 240] [--concurrency 4] [--max-cpu-loras 4]

With `--rounds R` (default 3), each round after the first starts adapter-aware and Ray Serve
LLM again, in the other order every other round, and measures the same load (no spread): a
3% difference in one run is within this host's drift, so the tokens/s comparison is the median
of the rounds' ratios.

Results: bench/results/adapter_routing.{json,md}, stamped with commit, date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench import adapter_routing_ray as ray_llm
from bench.adapter_routing_report import (
    ADAPTERS,
    ROUTERS,
    SPREAD_CONCURRENCY,
    SPREAD_REQUESTS,
    SYSTEMS,
    markdown,
)
from bench.client import Reply, send
from bench.peers import machine, systems
from bench.peers.__main__ import start
from bench.peers.spec import ROOT, TENANTS, default_bench_model, platform_app_args

RESULTS = ROOT / "bench" / "results"
CONFIG = ROOT / "serve_config.yaml"


class AdapterPlatform(systems.Platform):
    """The platform with two replicas, eight random adapters and this run's adapter weight."""

    def __init__(self, weights: dict, max_cpu_loras: int, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._weights, self._max_cpu_loras = weights, max_cpu_loras

    def spec(self) -> dict[str, Any]:
        app = platform_app_args(self.config_path, self.model)
        m = app["models"][0]
        m["routing"] = {**m.get("routing", {}), **self._weights, "session_affinity": False}
        m["deployment"] = {**m.get("deployment", {}), "num_replicas": 2}
        m["deployment"].pop("autoscaling", None)
        m["lora"] = {
            "max_loras": 2,
            "max_cpu_loras": self._max_cpu_loras,
            "max_lora_rank": 8,
            "adapters": [
                {"name": name, "source": f"random:{i}"} for i, name in enumerate(ADAPTERS, 1)
            ],
        }
        app["http"] = {**app.get("http", {}), "debug_headers": True}
        return {"app_args": app}


def zipf_draws(n: int, s: float, seed: int) -> list[str]:
    """`n` adapter names, the k-th most popular drawn with weight 1 / k**s."""
    rng = random.Random(seed)
    weights = [1 / k**s for k in range(1, len(ADAPTERS) + 1)]
    return rng.choices(ADAPTERS, weights=weights, k=n)


def same_name(adapter: str) -> str:
    return adapter


async def run_load(
    base_url: str, draws: list[str], a, model_of=same_name
) -> tuple[list[tuple[str, Reply]], float]:
    """Every drawn request, `a.concurrency` at once, streamed (TTFT) with usage; and the
    seconds they took. `model_of`: the adapter's name as the system wants it in `model`."""
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in enumerate(draws):
        queue.put_nowait(item)
    out: list[tuple[str, Reply]] = []
    headers = {"Authorization": f"Bearer {TENANTS.sweep}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers) as c:

        async def worker() -> None:
            while not queue.empty():
                i, adapter = queue.get_nowait()
                body = {
                    "model": model_of(adapter),
                    "prompt": f"Request {i}: write about the number {i}.",
                    "max_tokens": a.max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                out.append((adapter, await send(c, "/v1/completions", body)))

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(a.concurrency)))
    return out, time.monotonic() - t0


async def spread(base_url: str, a) -> dict[str, Any]:
    """The coldest adapter loaded by one request, then a burst of it (module docstring)."""
    cold = ADAPTERS[-1]
    [(_, first)], _ = await run_load(
        base_url, [cold], argparse.Namespace(**{**vars(a), "concurrency": 1})
    )
    burst = argparse.Namespace(**{**vars(a), "concurrency": SPREAD_CONCURRENCY})
    replies, _ = await run_load(base_url, [cold] * SPREAD_REQUESTS, burst)
    ok = [r for _, r in replies if r.status == 200 and r.done]
    t0 = min(r.start_s for _, r in replies)
    elsewhere = [r.start_s + r.ttft_s - t0 for r in ok if r.replica != first.replica and r.ttft_s]
    return {
        "adapter": cold,
        "failed": len(replies) - len(ok),
        "first_loaded_on": first.replica,
        "by_replica": dict(sorted(Counter(str(r.replica) for r in ok).items())),
        "second_replica_after_s": round(min(elsewhere), 2) if elsewhere else None,
    }


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def _ttft(replies: list[Reply]) -> dict[str, float | None]:
    ttfts = [r.ttft_s for r in replies if r.ttft_s]
    return {"p50": _p(ttfts, 0.5), "p99": _p(ttfts, 0.99)}


def summarize(replies: list[tuple[str, Reply]], span_s: float) -> dict[str, Any]:
    """The figures of one measured load. A system whose replies carry no `x-route` (Ray Serve
    LLM) gets None for what only that header tells: loads, TTFT by held, replicas."""
    ok = [(adapter, r) for adapter, r in replies if r.status == 200 and r.done]
    routed = any(r.route for _, r in ok)
    held = [r for _, r in ok if r.route and "adapter_held=True" in r.route]
    loaded = [r for _, r in ok if r.route and "adapter_held=False" in r.route]
    hottest = ADAPTERS[0]  # the Zipf draw's most popular
    tokens = sum(r.completion_tokens for _, r in ok)
    return {
        "requests": len(replies),
        "failed": len(replies) - len(ok),
        "loads_per_1000": round(1000 * len(loaded) / max(1, len(ok)), 1) if routed else None,
        "ttft_s": _ttft([r for _, r in ok]),
        "ttft_held_s": _ttft(held) if routed else None,
        "ttft_loaded_s": _ttft(loaded) if routed else None,
        "tokens_per_s": round(tokens / span_s, 1),
        "hottest_adapter": hottest,
        "hottest_by_replica": _by_replica(ok, hottest) if routed else None,
    }


def _by_replica(ok: list[tuple[str, Reply]], adapter: str) -> dict[str, int]:
    replicas = {r.replica for _, r in ok}
    counts = {rep: sum(1 for a_, r in ok if a_ == adapter and r.replica == rep) for rep in replicas}
    return dict(sorted(counts.items()))


def measure(
    system: systems.System, a, draws, warm, model_of=same_name, with_spread: bool = True
) -> dict[str, Any]:
    """Starts `system`, warms it, measures `draws`; the spread only where replies name their
    replica. The caller stops it."""
    entry: dict[str, Any] = {}
    entry["ready_s"], _ = start(system, 900)
    asyncio.run(run_load(system.base_url, warm, a, model_of))
    loads_before = system.loads() if hasattr(system, "loads") else None
    entry.update(summarize(*asyncio.run(run_load(system.base_url, draws, a, model_of))))
    if loads_before is not None:
        loads = system.loads() - loads_before
        entry["loads"] = loads
        entry["loads_per_1000"] = round(
            1000 * loads / max(1, entry["requests"] - entry["failed"]), 1
        )
    if with_spread and entry["hottest_by_replica"] is not None:
        entry["spread"] = asyncio.run(spread(system.base_url, a))
    return entry


def run_system(
    name: str, port: int, model, a, work_dir: Path, draws, warm, with_spread: bool = True
) -> dict[str, Any]:
    """One system's entry: its figures, or the error that stopped it."""
    entry: dict[str, Any] = {"weights": ROUTERS.get(name)}
    try:
        if name == ray_llm.NAME:
            entry.update(_run_ray(port, model, a, work_dir, draws, warm))
        else:
            system = AdapterPlatform(ROUTERS[name], a.max_cpu_loras, model, port, work_dir, CONFIG)
            print(f"== {name} (log {system.log_path})", flush=True)
            try:
                entry.update(measure(system, a, draws, warm, with_spread=with_spread))
            finally:
                system.stop()
        print(f"  {entry}", flush=True)
    except Exception as e:  # noqa: BLE001 - a failed system must still be stopped and reported
        entry["error"] = f"{type(e).__name__}: {e}"
        print(f"  FAILED: {entry['error']}", flush=True)
    return entry


def _run_ray(port: int, model, a, work_dir: Path, draws, warm) -> dict[str, Any]:
    """Ray Serve LLM over the platform's own settings (replicas, LoRA, adapter files)."""
    platform = AdapterPlatform({}, a.max_cpu_loras, model, port, work_dir, CONFIG)
    setup = ray_llm.Setup(model, platform.spec()["app_args"], port, work_dir, CONFIG)
    with ray_llm.started_store(setup) as system:
        print(f"== {ray_llm.NAME} (log {system.log_path})", flush=True)
        try:
            return measure(system, a, draws, warm, functools.partial(ray_llm.model_id, model.name))
        finally:
            system.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-cpu-loras", type=int, default=4, help="adapters each engine holds")
    p.add_argument("--routers", default=",".join(SYSTEMS), help="systems, in order")
    p.add_argument("--rounds", type=int, default=3, help="tokens/s rounds (module docstring)")
    p.add_argument("--port", type=int, default=18720)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
    a = p.parse_args()
    if a.report_only:
        doc = json.loads((a.out_dir / "adapter_routing.json").read_text())
        (a.out_dir / "adapter_routing.md").write_text(markdown(doc))
        return
    model = default_bench_model(CONFIG, a.max_model_len)
    work_dir = Path("/tmp/llmserve-adapter-routing") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    draws = zipf_draws(a.requests, a.zipf_s, seed=0)
    warm = zipf_draws(len(ADAPTERS) * 2, 0.0, seed=1)  # every adapter, first-request costs
    doc = header(model, a)
    names = a.routers.split(",")
    for i, name in enumerate(names):
        doc["routers"][name] = run_system(name, a.port + 10 * i, model, a, work_dir, draws, warm)
    doc["rounds"] = [{k: r.get("tokens_per_s") for k, r in doc["routers"].items()}]
    pair = [n for n in (SYSTEMS[0], ray_llm.NAME) if n in names]
    for k in range(1, a.rounds if len(pair) == 2 else 1):
        order = pair[::-1] if k % 2 else pair
        doc["rounds"].append(
            {
                name: run_system(
                    name, a.port + 10 * i, model, a, work_dir, draws, warm, with_spread=False
                ).get("tokens_per_s")
                for i, name in enumerate(order)
            }
        )
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "adapter_routing.json").write_text(json.dumps(doc, indent=1))
    (a.out_dir / "adapter_routing.md").write_text(markdown(doc))
    print(markdown(doc))


def header(model, a) -> dict[str, Any]:
    import ray

    return {
        "commit": machine._git("rev-parse", "--short", "HEAD"),
        "date": dt.date.today().isoformat(),
        "machine": f"{machine.cpu_model()}, {os.cpu_count()} logical CPUs",
        "model": model.name,
        "ray_version": ray.__version__,
        "workload": {
            "requests": a.requests,
            "concurrency": a.concurrency,
            "max_tokens": a.max_tokens,
            "zipf_s": a.zipf_s,
            "max_cpu_loras": a.max_cpu_loras,
        },
        "routers": {},
    }


if __name__ == "__main__":
    main()
