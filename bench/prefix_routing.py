"""Prefix-aware routing against load-only P2C and Ray Serve LLM's PrefixCacheAffinityRouter, on
two replicas of the default model, one router after the other in one run:

- multi-turn chat: sessions that share a long system prompt, each turn resending the
  conversation so far, all sessions at once; prefix-cache hit rate (the engine's own count of
  cached prompt tokens, from `usage.prompt_tokens_details`), TTFT p50/p99, and how far apart
  the two replicas' queues got;
- hot prefix: every request shares one long prefix, more at once than one replica batches;
  how the requests spread over the two replicas.

The same chat workload on one replica gives the ideal hit rate (every turn finds its history).

    .venv/bin/python -m bench.prefix_routing [--sessions 16] [--turns 4]

Results: bench/results/prefix_routing.{json,md}, stamped with commit, date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench import summary as readme_summary
from bench.client import send
from bench.peers import machine, systems
from bench.peers.__main__ import start
from bench.peers.spec import ROOT, TENANTS, Model, default_bench_model, platform_app_args
from bench.prefix_routing_report import Turn, markdown, summary
from llmserve.planning.memory_plan import kv_bytes_per_token, kv_dtype_bytes
from llmserve.planning.weights import ModelShape, dtype_bytes_for, load_hf_config

RESULTS = ROOT / "bench" / "results"
CONFIG = ROOT / "serve_config.yaml"
WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be "
    "have or had not but one all their they there been has when who will more if no out so up "
    "said what its about into than them can only other new some could time these two may then"
).split()
ROUTERS = {
    # name: (routing config, replicas, KV cache of each replica in units of --kv-cache-tokens)
    "prefix-aware": ({"policy": "llm_aware", "prefix_aware": True}, 2, 1),
    "p2c": ({"policy": "llm_aware", "prefix_aware": False}, 2, 1),
    "ray-prefix-affinity": ({"policy": "ray_prefix_affinity"}, 2, 1),
    # The ideal hit rate: one cache as large as the pair's, every turn finds its history.
    "one-replica": ({"policy": "llm_aware", "prefix_aware": True}, 1, 2),
}


def text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def kv_cache_bytes(model_dir: Path, dtype: str, num_tokens: int) -> int:
    """What `num_tokens` of the model's KV cache take in `dtype` (the memory planner's
    arithmetic)."""
    shape = ModelShape.from_hf_config(load_hf_config(model_dir))
    return num_tokens * kv_bytes_per_token(shape, kv_dtype_bytes("auto", dtype_bytes_for(dtype)))


class Platform2(systems.Platform):
    """The platform with this run's router, replica count, KV cache size and debug headers."""

    def __init__(self, routing: dict, replicas: int, kv_bytes: int, cores, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._routing, self._replicas, self._kv_bytes, self._cores = (
            routing,
            replicas,
            kv_bytes,
            cores,
        )

    def spec(self) -> dict[str, Any]:
        app = platform_app_args(self.config_path, self.model)
        m = app["models"][0]
        engine = {k: v for k, v in m["engine"].items() if k != "cpu_kv_cache_space_gib"}
        engine["extra"] = {**engine.get("extra", {}), "kv_cache_memory_bytes": self._kv_bytes}
        engine["cpu_cores_by_replica"] = self._cores
        m["engine"] = engine
        m["routing"] = {**m.get("routing", {}), **self._routing, "session_affinity": False}
        m["deployment"] = {**m.get("deployment", {}), "num_replicas": self._replicas}
        m["deployment"].pop("autoscaling", None)
        m["server"] = {
            **m.get("server", {}),
            "extra": {**m.get("server", {}).get("extra", {}), "enable_prompt_tokens_details": True},
        }
        app["http"] = {**app.get("http", {}), "debug_headers": True}
        return {"app_args": app}


async def chat(
    c: httpx.AsyncClient, model: str, messages: list[dict], max_tokens: int, tag: dict
) -> tuple[Turn, str]:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = await send(c, "/v1/chat/completions", body)
    # A Turn is the Reply's figures that the report reads, and where in the workload it was.
    figures = {k: getattr(r, k) for k in ("start_s", "end_s", "status", "ttft_s")}
    turn = Turn(
        **figures,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached_tokens,
        replica=r.replica or "",
        route=r.route or "",
        **tag,
    )
    return turn, r.text


async def multi_turn(base_url: str, model: str, a: argparse.Namespace) -> list[Turn]:
    system = "You are the support assistant of a large company. " + text(
        random.Random(0), a.system_words
    )
    out: list[Turn] = []

    async def session(c: httpx.AsyncClient, s: int) -> None:
        rng = random.Random(1000 + s)
        messages = [{"role": "system", "content": system}]
        await asyncio.sleep(s * a.stagger_s)
        for t in range(a.turns):
            messages.append({"role": "user", "content": text(rng, a.user_words)})
            turn, answer = await chat(
                c, model, messages, a.max_tokens, {"scenario": "chat", "session": s, "turn": t}
            )
            out.append(turn)
            messages.append({"role": "assistant", "content": answer})
            await asyncio.sleep(a.think_s)

    async with _client(base_url) as c:
        await asyncio.gather(*(session(c, s) for s in range(a.sessions)))
    return out


async def hot_prefix(base_url: str, model: str, a: argparse.Namespace) -> list[Turn]:
    system = "You answer questions about one manual. " + text(random.Random(7), a.hot_words)
    out: list[Turn] = []
    sem = asyncio.Semaphore(a.hot_concurrency)

    async def one(c: httpx.AsyncClient, i: int) -> None:
        async with sem:
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {i}: " + text(random.Random(i), 12)},
            ]
            turn, _ = await chat(
                c, model, messages, a.max_tokens, {"scenario": "hot", "session": i, "turn": 0}
            )
            out.append(turn)

    async with _client(base_url) as c:
        await asyncio.gather(*(one(c, i) for i in range(a.hot_requests)))
    return out


def _client(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=600,
        headers={"Authorization": f"Bearer {TENANTS.sweep}"},
        limits=httpx.Limits(max_connections=256),
    )


def run_router(name: str, port: int, model: Model, a, work_dir: Path) -> dict[str, Any]:
    routing, replicas, kv_units = ROUTERS[name]
    kv_tokens = kv_units * a.kv_cache_tokens
    kv_bytes = kv_cache_bytes(model.path, model.engine_args["dtype"], kv_tokens)
    system = Platform2(routing, replicas, kv_bytes, a.replica_cores, model, port, work_dir, CONFIG)
    entry: dict[str, Any] = {
        "routing": routing,
        "replicas": replicas,
        "kv_cache_tokens_per_replica": kv_tokens,
        "error": None,
    }
    print(f"== {name} ({replicas} replica(s), log {system.log_path})", flush=True)
    try:
        entry["ready_s"], _ = start(system, 900)
        # Warm-up requests that share nothing with the workloads (first-request costs), until
        # every replica has answered one: the model answers once its first replica is up.
        entry["replicas_ready_s"] = asyncio.run(warm_up(system.base_url, model.name, replicas))
        chat_turns = asyncio.run(multi_turn(system.base_url, model.name, a))
        entry["chat"] = summary(chat_turns)
        if replicas > 1:
            hot_turns = asyncio.run(hot_prefix(system.base_url, model.name, a))
            entry["hot"] = summary(hot_turns)
            chat_turns += hot_turns
        entry["turns"] = [asdict(t) for t in chat_turns]
        print(f"  chat {entry['chat']}\n  hot {entry.get('hot')}", flush=True)
    except BaseException as e:  # noqa: BLE001 - a failed run must still be stopped and reported
        entry["error"] = f"{type(e).__name__}: {e}"
        print(f"  FAILED: {entry['error']}", flush=True)
        if isinstance(e, KeyboardInterrupt):
            raise
    finally:
        stop = system.stop()
        print(f"  stopped in {stop.stop_s} s (clean={stop.clean})", flush=True)
    return entry


async def warm_up(base_url: str, model: str, replicas: int, timeout_s: float = 900) -> float:
    t0 = time.monotonic()
    seen: set[str] = set()
    async with _client(base_url) as c:
        while len(seen) < replicas:
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"only replicas {seen} answered within {timeout_s} s")
            # Different words each time: a text-matching router would send "Hi" to one replica.
            rng = random.Random(len(seen) * 1000 + int(time.monotonic()))
            turns = await asyncio.gather(
                *(
                    chat(c, model, [{"role": "user", "content": text(rng, 8)}], 2, _WARM)
                    for _ in range(4)
                )
            )
            seen |= {t.replica for t, _ in turns if t.status == 200}
            await asyncio.sleep(1)
    return round(time.monotonic() - t0, 1)


_WARM = {"scenario": "warm", "session": -1, "turn": 0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Sized so that the conversations (~1,900 tokens each by the last turn, ~15,000 in all) fit
    # in the pair's KV caches but not in one replica's: as on GPUs, cache space is what a
    # router must not waste (a replica holding every history evicts them before their next turn).
    # The think time keeps a 2-core host's pair of engines busy, not minutes behind.
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=780)
    p.add_argument("--user-words", type=int, default=150)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-tokens", type=int, default=8192, help="per replica")
    p.add_argument(
        "--replica-cores",
        nargs="+",
        help="engine.cpu_cores_by_replica; default: vLLM's own binding (on a host this small, "
        "every engine's worker on the same core, so every router gets the same compute)",
    )
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--think-s", type=float, default=4.0)
    p.add_argument("--stagger-s", type=float, default=0.5)
    p.add_argument("--hot-words", type=int, default=1100)
    p.add_argument("--hot-requests", type=int, default=48)
    p.add_argument("--hot-concurrency", type=int, default=40)
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--port", type=int, default=18620)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
    a = p.parse_args()
    if a.report_only:
        doc = json.loads((a.out_dir / "prefix_routing.json").read_text())
        doc.setdefault("logical_cpus", os.cpu_count())
        (a.out_dir / "prefix_routing.md").write_text(markdown(doc))
        return
    model = default_bench_model(CONFIG, a.max_model_len)
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    work_dir = Path("/tmp/llmserve-prefix-routing") / stamp
    doc: dict[str, Any] = {
        "commit": machine._git("rev-parse", "--short", "HEAD"),
        "date": dt.date.today().isoformat(),
        "machine": f"{machine.cpu_model()}, {os.cpu_count()} logical CPUs",
        "logical_cpus": os.cpu_count(),
        "workload": {
            k: v
            for k, v in vars(a).items()
            if k not in ("out_dir", "routers", "port", "report_only")
        },
        "routers": {},
    }
    for i, name in enumerate(a.routers.split(",")):
        doc["routers"][name] = run_router(name, a.port + 10 * i, model, a, work_dir)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "prefix_routing.json").write_text(json.dumps(doc, indent=1))
    (a.out_dir / "prefix_routing.md").write_text(markdown(doc))
    if a.out_dir.resolve() == RESULTS.resolve():
        readme_summary.update_readme()  # the README's figures, from these results
    print(markdown(doc))


if __name__ == "__main__":
    main()
